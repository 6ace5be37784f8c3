"""Random nested batches: stoker.collate gives torch's result, or torch's exception.

A *schema* fixes a sample's structure (containers, leaf kinds, dtypes, shapes); a batch is
1-5 samples drawn from one schema, sometimes with one sample drawn from a mutated schema (or
from an unrelated one) so that both implementations must fail, and fail the same way.
"""

from __future__ import annotations

import collections
from typing import Any
from unittest import mock

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
import torch.utils.data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_collate import BufferAllocator, assert_same_outcome, tensors_in
from torch.utils.data._utils import collate as torch_collate_mod

from stoker.collate import _leaves, allocating_into, collate, default_collate, default_convert

Schema = tuple[Any, ...]
# Odd batches make torch (and so us) warn, e.g. about indexing a tensor with a list.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NAMEDTUPLES = {n: collections.namedtuple(f"NT{n}", list("abc"[:n])) for n in (0, 1, 2, 3)}  # type: ignore[misc]
# torch dtype -> the numpy dtype its values are drawn in.
TORCH_DTYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: np.float32,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int64: np.int64,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
}
NP_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]
NP_DTYPES += [np.uint16, np.bool_, np.complex64]
NP_SCALARS = [np.float32, np.float64, np.int64, np.int8, np.uint8, np.bool_, np.complex64]
SIMPLE_LEAVES = ["int", "float", "bool", "str", "bytes"]

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)


# ---------------------------------------------------------------- schemas


def leaf_schemas() -> st.SearchStrategy[Schema]:
    return st.one_of(
        st.tuples(st.just("tensor"), st.sampled_from(list(TORCH_DTYPES)), shapes),
        st.tuples(st.just("ndarray"), st.sampled_from(NP_DTYPES), shapes),
        st.tuples(st.just("npscalar"), st.sampled_from(NP_SCALARS)),
        st.sampled_from(SIMPLE_LEAVES).map(lambda kind: (kind,)),
    )


def _containers(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    items = st.lists(children, max_size=3).map(tuple)
    return st.one_of(
        st.lists(
            st.tuples(st.sampled_from("abcd"), children), max_size=3, unique_by=lambda kv: kv[0]
        ).map(lambda kvs: ("dict", tuple(kvs))),
        items.map(lambda cs: ("list", cs)),
        items.map(lambda cs: ("tuple", cs)),
        st.lists(children, min_size=1, max_size=3).map(lambda cs: ("namedtuple", tuple(cs))),
    )


schemas = st.recursive(leaf_schemas(), _containers, max_leaves=6)


def mutated(schema: Schema) -> st.SearchStrategy[Schema]:
    """``schema`` with one thing changed: a shape, a dtype, a leaf kind, a length, a key."""
    kind = schema[0]
    if kind in ("tensor", "ndarray"):
        return st.one_of(
            shapes.map(lambda s: (kind, schema[1], s)),
            leaf_schemas(),
            st.just(("none",)),
        )
    if kind in ("dict", "list", "tuple", "namedtuple"):
        children = schema[1]
        options = [st.just((kind, children[:-1])), leaf_schemas()]
        if kind == "list":
            options.append(st.just(("tuple", children)))
        if children:
            options.append(
                st.integers(0, len(children) - 1).flatmap(
                    lambda i: _mutate_child(kind, children, i)
                )
            )
        return st.one_of(options)
    return st.one_of(leaf_schemas(), st.just(("none",)))


def _mutate_child(kind: str, children: tuple[Any, ...], i: int) -> st.SearchStrategy[Schema]:
    if kind == "dict":
        key, child = children[i]
        renamed = st.just((kind, (*children[:i], (key + "x", child), *children[i + 1 :])))
        changed = mutated(child).map(
            lambda c: (kind, (*children[:i], (key, c), *children[i + 1 :]))
        )
        return st.one_of(renamed, changed)
    return mutated(children[i]).map(lambda c: (kind, (*children[:i], c, *children[i + 1 :])))


# ---------------------------------------------------------------- values


def values(schema: Schema) -> st.SearchStrategy[Any]:
    kind = schema[0]
    if kind == "tensor":
        _, dtype, shape = schema
        return hnp.arrays(TORCH_DTYPES[dtype], shape).map(lambda a: torch.from_numpy(a).to(dtype))
    if kind == "ndarray":
        return _arrays(schema[1], schema[2])
    if kind == "npscalar":
        return hnp.from_dtype(np.dtype(schema[1]))
    if kind in ("dict", "list", "tuple", "namedtuple"):
        return _container_values(kind, schema[1])
    return {
        "int": st.one_of(st.integers(-5, 5), st.integers(-(2**63), 2**63 - 1), st.integers()),
        "float": st.floats(),
        "bool": st.booleans(),
        "str": st.text(max_size=3),
        "bytes": st.binary(max_size=3),
        "none": st.none(),
    }[kind]


def _arrays(dtype: Any, shape: tuple[int, ...]) -> st.SearchStrategy[Any]:
    """Contiguous mostly; sometimes a strided view, rarely a reversed one (torch rejects)."""
    plain = hnp.arrays(dtype, shape)
    if not shape:
        return plain
    doubled = (shape[0] * 2, *shape[1:])
    return st.one_of(
        plain,
        hnp.arrays(dtype, doubled).map(lambda a: a[::2]),
        hnp.arrays(dtype, shape).map(lambda a: a[::-1]),
    )


def _container_values(kind: str, children: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    if kind == "dict":
        return st.fixed_dictionaries({key: values(child) for key, child in children})
    parts = st.tuples(*(values(child) for child in children))
    if kind == "list":
        return parts.map(list)
    if kind == "namedtuple":
        return parts.map(lambda p: NAMEDTUPLES[len(p)](*p))
    return parts


@st.composite
def batches(draw: st.DrawFn) -> list[Any]:
    schema = draw(schemas)
    batch = draw(st.lists(values(schema), min_size=1, max_size=5))
    odd = draw(st.sampled_from(["none", "none", "none", "mutated", "unrelated"]))
    if odd != "none":
        other = draw(mutated(schema) if odd == "mutated" else schemas)
        batch.insert(draw(st.integers(0, len(batch))), draw(values(other)))
    return batch


# ---------------------------------------------------------------- properties


def torch_result(batch: list[Any]) -> Any:
    return torch.utils.data.default_collate(batch)


@SETTINGS
@given(batch=batches())
def test_default_collate_matches_torch(batch: list[Any]) -> None:
    assert_same_outcome(lambda: default_collate(batch), lambda: torch_result(batch))


@SETTINGS
@given(batch=batches())
def test_collate_with_torchs_map_matches_torch(batch: list[Any]) -> None:
    fn_map = torch_collate_mod.default_collate_fn_map
    assert_same_outcome(lambda: collate(batch, collate_fn_map=fn_map), lambda: torch_result(batch))


@pytest.mark.parametrize("direct_min_elem_bytes", [_leaves._DIRECT_STACK_MIN_ELEM_BYTES, 0])
@SETTINGS
@given(batch=batches(), refuse=st.booleans())
def test_with_allocator_matches_torch(
    direct_min_elem_bytes: int, batch: list[Any], refuse: bool
) -> None:
    # direct_min_elem_bytes=0 sends every tensor batch down the stack-straight-into-out path.
    allocator = BufferAllocator(nbytes=1 << 20, refuse=refuse)

    def ours() -> Any:
        with (
            mock.patch.object(_leaves, "_DIRECT_STACK_MIN_ELEM_BYTES", direct_min_elem_bytes),
            allocating_into(allocator),
        ):
            return default_collate(batch)

    assert_same_outcome(ours, lambda: torch_result(batch))
    try:
        result = ours()
    except Exception:  # the same failure as torch's, checked above
        return
    if not refuse:
        # Tensors collate passed through untouched (a batch whose first sample is a str is
        # returned as is; a str column of a sequence sample holds rows unpacked from the
        # samples' tensors) view the user's own memory; every tensor collate built must be in
        # the buffer.
        users = {t.untyped_storage().data_ptr() for t in tensors_in(batch)}
        built = [t for t in tensors_in(result)
                 if t.numel() and t.untyped_storage().data_ptr() not in users]
        assert all(allocator.owns(t) for t in built)


@SETTINGS
@given(sample=schemas.flatmap(values))
def test_default_convert_matches_torch(sample: Any) -> None:
    assert_same_outcome(
        lambda: default_convert(sample), lambda: torch.utils.data.default_convert(sample)
    )
