"""stoker.collate against torch's default_collate/default_convert, branch by branch."""

from __future__ import annotations

import collections
import enum
import math
import threading
import types
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple
from unittest import mock

import numpy as np
import pytest
import torch
import torch.utils.data
from torch.utils.data._utils import collate as torch_collate_mod

from stoker.collate import (
    allocating_into,
    collate,
    current_allocator,
    default_collate,
    default_collate_err_msg_format,
    default_collate_fn_map,
    default_convert,
)

torch_default_collate = torch.utils.data.default_collate
torch_default_convert = torch.utils.data.default_convert
torch_collate_fn_map = torch_collate_mod.default_collate_fn_map


# ---------------------------------------------------------------- helpers (also used by the
# hypothesis tests)


def assert_same(ours: Any, theirs: Any, path: str = "batch") -> None:
    """Same types all the way down; tensors equal bit for bit, with the same dtype/shape."""
    assert type(ours) is type(theirs), f"{path}: {type(ours)} != {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, f"{path}: {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: {ours.shape} != {theirs.shape}"
        assert ours.requires_grad == theirs.requires_grad, path
        assert torch.equal(_bits(ours), _bits(theirs)), f"{path}: {ours} != {theirs}"
    elif isinstance(theirs, Mapping):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, Sequence) and not isinstance(theirs, (str, bytes, range)):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), path
    else:
        both_nan = ours != ours and theirs != theirs
        assert ours == theirs or both_nan, f"{path}: {ours!r} != {theirs!r}"


def _bits(t: torch.Tensor) -> torch.Tensor:
    # NaN != NaN, so compare raw bytes.
    if not t.numel():
        return torch.empty(0, dtype=torch.uint8)
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as exc:  # the exception is the result under test
        return "raised", exc


def assert_same_outcome(ours: Callable[[], Any], theirs: Callable[[], Any]) -> None:
    """Both give the same result, or both raise the same exception type with the same text."""
    (kind_a, a), (kind_b, b) = outcome(ours), outcome(theirs)
    assert kind_a == kind_b, f"ours {kind_a} {a!r}, torch {kind_b} {b!r}"
    if kind_a == "raised":
        assert (type(a), str(a)) == (type(b), str(b))
    else:
        assert_same(a, b)


class BufferAllocator:
    """Hands out 64-byte-aligned slices of one preallocated buffer, and counts the calls."""

    def __init__(self, nbytes: int = 1 << 22, refuse: bool = False) -> None:
        self.buffer = torch.zeros(nbytes, dtype=torch.uint8)
        self.refuse = refuse
        self.offset = 0
        self.calls: list[tuple[tuple[int, ...], torch.dtype]] = []

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        self.calls.append((shape, dtype))
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        start = -(-self.offset // 64) * 64
        if self.refuse or start + nbytes > self.buffer.numel():
            return None
        self.offset = start + nbytes
        return self.buffer[start : start + nbytes].view(dtype).view(shape)

    def owns(self, t: torch.Tensor) -> bool:
        lo = self.buffer.data_ptr()
        hi = lo + self.buffer.numel()
        return lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi


def tensors_in(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, Mapping):
        for value in tree.values():
            yield from tensors_in(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from tensors_in(value)


def check(batch: Any) -> None:
    assert_same_outcome(lambda: default_collate(batch), lambda: torch_default_collate(batch))


# ---------------------------------------------------------------- the map and the surface


def test_map_has_torchs_keys_in_torchs_order() -> None:
    assert list(default_collate_fn_map) == list(torch_collate_fn_map)
    assert default_collate_err_msg_format == torch_collate_mod.default_collate_err_msg_format


def test_no_allocator_by_default() -> None:
    assert current_allocator() is None


# ---------------------------------------------------------------- tensors


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8]
    + [torch.int64, torch.bool, torch.complex64, torch.uint16],
)
def test_tensors_stack(dtype: torch.dtype) -> None:
    check([(torch.arange(6).reshape(2, 3) + i).to(dtype) for i in range(3)])


def test_zero_dim_and_empty_tensors() -> None:
    check([torch.tensor(1.5), torch.tensor(2.5)])
    check([torch.empty(0, 3), torch.empty(0, 3)])


def test_tensors_of_mixed_dtype_promote_like_torch() -> None:
    check([torch.ones(2, dtype=torch.float32), torch.ones(2, dtype=torch.float64)])


def test_tensor_shape_mismatch_error() -> None:
    check([torch.ones(2), torch.ones(3)])


def test_tensor_requiring_grad_and_subclass() -> None:
    check([torch.ones(2, requires_grad=True), torch.ones(2)])
    param = torch.nn.Parameter(torch.ones(2))
    check([param, param])


def test_non_contiguous_and_channels_last_tensors() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    check([x, x + 1])
    check([torch.randn(4, 6)[:, ::2], torch.randn(4, 6)[:, ::2]])


def test_nested_tensor_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "nested tensors are in prototype", once
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    check([nested, nested])


@pytest.mark.parametrize("to_sparse", [torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr])
def test_sparse_tensor_error(to_sparse: Callable[[torch.Tensor], torch.Tensor]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "CSR support is in beta"
        sparse = to_sparse(torch.eye(3))
    check([sparse, sparse])


def test_without_allocator_output_is_not_shared_memory() -> None:
    out = default_collate([torch.ones(3), torch.ones(3)])
    assert not out.is_shared()


# ---------------------------------------------------------------- numpy


@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.int32, np.int64]
    + [np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128],
)
def test_numpy_arrays(dtype: type) -> None:
    check([np.arange(6).reshape(2, 3).astype(dtype) for _ in range(4)])


def test_numpy_zero_dim_and_empty_arrays() -> None:
    check([np.array(1.5, dtype=np.float32), np.array(2.5, dtype=np.float32)])
    check([np.empty((0, 2)), np.empty((0, 2))])
    check([np.empty((2, 0)), np.empty((2, 0))])


def test_numpy_views_memmap_and_mixtures() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    check([base[:, ::2], base[:, 1::2]])  # positive strides, not contiguous
    check([base.T, base.T])
    check([base.astype(np.float64), base])  # mixed dtypes promote like torch
    check([np.array([1, 2]), [3, 4]])  # an array then a list
    check([np.array([1.0, 2.0], dtype=np.float32), torch.ones(2)])
    readonly = np.arange(3)
    readonly.flags.writeable = False
    assert_same(default_collate([readonly, readonly]), torch.stack([torch.arange(3)] * 2))


def test_numpy_memmap(tmp_path: Any) -> None:
    mm = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="w+", shape=(3,))
    mm[:] = [1, 2, 3]
    check([mm, mm])
    check([mm, np.ones(3, dtype=np.float32)])


def test_numeric_arrays_skip_per_sample_conversion() -> None:
    batch = [np.full((2, 3), i, dtype=np.float32) for i in range(4)]
    expected = torch_default_collate(batch)
    with mock.patch.object(torch, "as_tensor", side_effect=AssertionError("per-sample path")):
        assert_same(default_collate(batch), expected)


@pytest.mark.parametrize(
    "arrays",
    [
        [np.arange(3)[::-1], np.arange(3)],  # negative stride
        [np.arange(3), np.arange(3)[::-1]],
        [np.arange(3, dtype=">f4"), np.arange(3, dtype=">f4")],  # non-native byte order
        [np.zeros(3, dtype="i2,i1")["f0"], np.zeros(3, dtype="i2,i1")["f0"]],  # odd strides
        [np.ones(2), np.ones(3)],  # shape mismatch
        [np.ones(2), np.ones((2, 1))],
        [np.array(["a", "b"]), np.array(["c", "d"])],  # str
        [np.array([b"a"]), np.array([b"b"])],  # bytes
        [np.array([object()]), np.array([object()])],  # object
        [np.zeros(2, dtype="datetime64[s]")] * 2,
        [np.zeros(2, dtype=np.longdouble)] * 2,
        [np.zeros(2, dtype="i2,i1")] * 2,  # structured
        [np.ones(2), None],
    ],
)
def test_numpy_errors_match_torch(arrays: list[Any]) -> None:
    check(arrays)


def test_numpy_str_array_message() -> None:
    with pytest.raises(TypeError) as info:
        default_collate([np.array(["a"]), np.array(["b"])])
    assert str(info.value) == default_collate_err_msg_format.format("<U1")


@pytest.mark.parametrize(
    "scalars",
    [
        [np.float32(1.5), np.float32(2)],
        [np.float64(1.5), np.float64(2)],  # a float subclass, still a numpy scalar
        [np.int64(3), np.int64(4)],
        [np.uint8(3), np.int16(4)],
        [np.bool_(True), np.bool_(False)],
        [np.complex64(1j), np.complex64(2)],
        [np.float32(1), 2.5],
        [np.str_("a"), np.str_("b")],  # a str subclass: kept
        [np.bytes_(b"a"), np.bytes_(b"b")],
    ],
)
def test_numpy_scalars(scalars: list[Any]) -> None:
    check(scalars)


# ---------------------------------------------------------------- Python numbers, str, bytes


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


@pytest.mark.parametrize(
    "numbers",
    [
        [1.5, 2.5, float("nan"), -0.0, float("inf")],
        [1, 2, -3],
        [True, False],
        [True, 2],  # int64
        [1, True],
        [1, 2.5],  # default float dtype (float32)
        [1.5, 2],  # float64
        [1.5, True],
        [Color.RED, Color.BLUE],
        [1, Color.BLUE],
        [2**63 - 1, -(2**63)],
        [2**63],  # torch's overflow error
        [1, 2**64],
        [1.0, 2**70],
        [1, "a"],
        [1.0, "a"],
        [1, None],
    ],
)
def test_python_numbers(numbers: list[Any]) -> None:
    check(numbers)


def test_python_numbers_under_another_default_dtype() -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        check([1, 2.5])
    finally:
        torch.set_default_dtype(previous)


def test_str_and_bytes_come_back_as_the_batch_itself() -> None:
    strings = ["a", "b"]
    assert default_collate(strings) is strings
    check([b"a", b"b"])
    check([("a", 1), ("b", 2)])  # under a tuple: the column is a tuple
    check([{"k": "a"}, {"k": "b"}])  # under a dict: a list


# ---------------------------------------------------------------- containers


class Point(NamedTuple):
    x: Any
    y: Any


PointC = collections.namedtuple("PointC", ["a", "b", "c"])


class FrozenMapping(Mapping[Any, Any]):
    """Immutable, constructible from a dict: its type is kept."""

    def __init__(self, data: Mapping[Any, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class Uncopyable(collections.UserDict):  # type: ignore[type-arg]
    def __copy__(self) -> Any:
        raise TypeError("no copies")


class NoFromDict(FrozenMapping):
    def __init__(self, *pairs: Any) -> None:
        super().__init__(dict(pairs))


class Tagged(dict):  # type: ignore[type-arg]
    """A mutable mapping with state that copy.copy keeps and type(...)(...) would lose."""

    tag = "default"


def _tagged(**values: Any) -> Tagged:
    out = Tagged(values)
    out.tag = "kept"
    return out


@pytest.mark.parametrize(
    "batch",
    [
        [{"x": torch.ones(2), "y": 1}, {"x": torch.zeros(2), "y": 2}],
        [{"a": {"b": [1, 2]}}, {"a": {"b": [3, 4]}}],
        [collections.OrderedDict(a=1, b=2.0), collections.OrderedDict(a=3, b=4.0)],
        [types.MappingProxyType({"a": 1}), types.MappingProxyType({"a": 2})],
        [FrozenMapping({"a": 1}), FrozenMapping({"a": 2})],
        [Uncopyable(a=1), Uncopyable(a=2)],
        [NoFromDict(("a", 1)), NoFromDict(("a", 2))],
        [{"a": 1}, {"b": 1}],  # KeyError
        [{"a": 1}, {"a": 1, "b": 2}],  # extra keys in later samples are ignored
        [{"a": None}, {"a": None}],
    ],
)
def test_mappings(batch: list[Any]) -> None:
    check(batch)


def test_mutable_mapping_keeps_its_state() -> None:
    dd = collections.defaultdict(list, a=1)
    out = default_collate([dd, collections.defaultdict(list, a=2)])
    assert type(out) is collections.defaultdict and out.default_factory is list
    tagged = default_collate([_tagged(a=1), _tagged(a=2)])
    assert type(tagged) is Tagged and tagged.tag == "kept"
    assert_same(tagged, torch_default_collate([_tagged(a=1), _tagged(a=2)]))


@pytest.mark.parametrize(
    "batch",
    [
        [Point(1, 2.0), Point(3, 4.0)],
        [PointC(torch.ones(1), "s", np.ones(2)), PointC(torch.ones(1), "t", np.ones(2))],
        [Point(1, 2), (3,)],  # zip truncates, then the constructor raises
        [Point(1, 2), (3, 4, 5)],
        [[1, 2], [3, 4]],
        [(1, 2), (3, 4)],
        [[1, 2], (3, 4)],
        [[1, 2], [3]],  # unequal sizes
        [[1, 2], [3], 5],  # the size check stops at the first mismatch, like torch's
        [[1, 2], 5],
        [collections.UserList([1, 2]), collections.UserList([3, 4])],
        [collections.deque([1, 2]), collections.deque([3, 4])],
        [range(3), range(3)],
        [[[1, (2.0, "a")]], [[3, (4.0, "b")]]],
    ],
)
def test_sequences_and_namedtuples(batch: list[Any]) -> None:
    check(batch)


def test_tuple_batch_and_tuple_subclass() -> None:
    class Pair(tuple):  # type: ignore[type-arg]
        pass

    check((torch.ones(1), torch.ones(1)))
    check([Pair((1, 2)), Pair((3, 4))])


@pytest.mark.parametrize("batch", [[None, None], [{1, 2}, {3}], [object()], [1j, 2j], []])
def test_unsupported_types(batch: list[Any]) -> None:
    check(batch)


def test_unsupported_type_message() -> None:
    with pytest.raises(TypeError) as info:
        default_collate([None])
    assert str(info.value) == (
        "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
        "found <class 'NoneType'>"
    )


# ---------------------------------------------------------------- collate maps


class Custom:
    def __init__(self, value: int) -> None:
        self.value = value


def collate_custom(batch: list[Custom], *, collate_fn_map: Any = None) -> torch.Tensor:
    return torch.tensor([c.value for c in batch]) * 10


def first_only(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    return batch[0]


@pytest.mark.parametrize("base", [default_collate_fn_map, torch_collate_fn_map])
def test_custom_type_via_map(base: dict[Any, Any]) -> None:
    fn_map = {**base, Custom: collate_custom}
    batch = [{"c": Custom(1), "x": np.ones(2)}, {"c": Custom(2), "x": np.ones(2)}]
    ours = collate(batch, collate_fn_map=fn_map)
    assert_same(ours, torch_collate_mod.collate(batch, collate_fn_map=fn_map))
    assert_same(ours["c"], torch.tensor([10, 20]))


@pytest.mark.parametrize("base", [default_collate_fn_map, torch_collate_fn_map])
def test_users_tensor_function_wins_also_for_numpy(base: dict[Any, Any]) -> None:
    fn_map = {**base, torch.Tensor: first_only}
    batch = [(torch.ones(2), np.zeros(3)), (torch.zeros(2), np.ones(3))]
    ours = collate(batch, collate_fn_map=fn_map)
    assert_same(ours, torch_collate_mod.collate(batch, collate_fn_map=fn_map))
    assert_same(ours, [torch.ones(2), torch.zeros(3, dtype=torch.float64)])


def test_isinstance_scan_follows_map_order() -> None:
    fn_map: dict[Any, Any] = {float: first_only}  # first in the scan: np.float64 is a float
    fn_map.update((k, v) for k, v in default_collate_fn_map.items() if k is not float)
    batch = [np.float64(1.0), np.float64(2.0)]
    assert_same(collate(batch, collate_fn_map=fn_map), np.float64(1.0))
    fn_map = {Mapping: first_only}
    batch2 = [{"a": 1}, {"a": 2}]
    assert collate(batch2, collate_fn_map=fn_map) == {"a": 1}


def test_collate_without_map() -> None:
    for batch in ([torch.ones(1), torch.ones(1)], [np.ones(1), np.ones(1)], [[1], [2]]):
        assert_same_outcome(
            lambda b=batch: collate(b), lambda b=batch: torch_collate_mod.collate(b)
        )
    assert_same_outcome(
        lambda: collate(
            [np.ones(1)] * 2, collate_fn_map={np.ndarray: torch_collate_mod.collate_numpy_array_fn}
        ),
        lambda: torch_collate_mod.collate(
            [np.ones(1)] * 2, collate_fn_map={np.ndarray: torch_collate_mod.collate_numpy_array_fn}
        ),
    )


def test_torch_collate_accepts_our_map() -> None:
    batch = [{"x": np.ones(2), "y": 1.0}, {"x": np.ones(2), "y": 2.0}]
    assert_same(
        torch_collate_mod.collate(batch, collate_fn_map=default_collate_fn_map),
        torch_default_collate(batch),
    )


# ---------------------------------------------------------------- default_convert


@pytest.mark.parametrize(
    "data",
    [
        torch.ones(2),
        np.arange(3),
        np.float32(1.5),
        np.array(["a"]),
        np.array([object()]),
        np.str_("a"),
        np.bytes_(b"a"),  # torch raises: np.bytes_ is not excluded by its name test
        1,
        "abc",
        b"abc",
        None,
        {"a": np.ones(1), "b": [np.zeros(1), 1]},
        collections.OrderedDict(a=np.ones(1)),
        types.MappingProxyType({"a": np.ones(1)}),
        Uncopyable(a=np.ones(1)),
        Point(np.ones(1), 2),
        (np.ones(1), "x"),
        [np.ones(1), (np.ones(2),)],
        collections.UserList([np.ones(1)]),
        range(3),
    ],
)
def test_default_convert(data: Any) -> None:
    assert_same_outcome(lambda: default_convert(data), lambda: torch_default_convert(data))


def test_default_convert_keeps_tensor_identity() -> None:
    t = torch.ones(2)
    assert default_convert(t) is t


# ---------------------------------------------------------------- allocator


def _allocated(batch: Any, allocator: BufferAllocator) -> Any:
    with allocating_into(allocator) as active:
        assert active is allocator and current_allocator() is allocator
        return default_collate(batch)


@pytest.mark.parametrize(
    "batch",
    [
        [{"x": torch.randn(4, 3), "y": 1, "z": 0.5}, {"x": torch.randn(4, 3), "y": 2, "z": 1.5}],
        [torch.randn(64, 64, 32) for _ in range(3)],  # large: stacked straight into the buffer
        [np.random.rand(3, 2).astype(np.float32) for _ in range(4)],
        [np.random.rand(64, 64, 32) for _ in range(3)],
        [np.array(1.5), np.array(2.5)],
        [(True, np.int16(3), np.float32(1)), (False, np.int16(4), np.float32(2))],
        [
            Point(torch.ones(2, dtype=torch.bfloat16), 3),
            Point(torch.zeros(2, dtype=torch.bfloat16), 4),
        ],
    ],
)
def test_allocator_outputs_live_in_its_buffer(batch: Any) -> None:
    allocator = BufferAllocator(nbytes=1 << 24)
    ours = _allocated(batch, allocator)
    assert_same(ours, torch_default_collate(batch))
    outputs = list(tensors_in(ours))
    assert outputs and all(allocator.owns(t) for t in outputs)
    assert len(allocator.calls) == len(outputs)
    assert [(tuple(t.shape), t.dtype) for t in outputs] == allocator.calls
    assert current_allocator() is None


def test_allocator_direct_stack_asks_once_for_the_stacked_shape() -> None:
    batch = [torch.randn(256, 256) for _ in range(4)]
    allocator = BufferAllocator(nbytes=1 << 21)
    out = _allocated(batch, allocator)
    assert allocator.calls == [((4, 256, 256), torch.float32)]
    assert allocator.owns(out) and torch.equal(out, torch.stack(batch))


def test_numpy_arrays_are_copied_once_into_one_allocation() -> None:
    batch = [np.full((2, 3), i, dtype=np.int32) for i in range(5)]
    allocator = BufferAllocator()
    out = _allocated(batch, allocator)
    assert allocator.calls == [((5, 2, 3), torch.int32)]
    assert allocator.owns(out)
    assert_same(out, torch_default_collate(batch))


@pytest.mark.parametrize(
    "batch",
    [
        [torch.randn(64, 64, 32, requires_grad=True), torch.randn(64, 64, 32)],
        [torch.randn(64, 64, 32), torch.randn(64, 64, 32, dtype=torch.float64)],
        [torch.randn(64, 64, 32), torch.randn(64, 64, 31)],
        [torch.nn.Parameter(torch.randn(64, 64, 32))] * 2,
        [torch.randn(64, 64, 32).to(torch.int8), torch.randn(64, 64, 32).to(torch.int8)],
        [{"x": 1, "y": "a"}, {"x": 2**63, "y": "b"}],
        [np.arange(3)[::-1], np.arange(3)[::-1]],
        [np.ones(2, dtype=np.float32), np.ones(2)],
    ],
)
def test_allocator_edge_cases_still_match_torch(batch: Any) -> None:
    for allocator in (BufferAllocator(nbytes=1 << 24), BufferAllocator(refuse=True)):
        assert_same_outcome(
            lambda a=allocator: _allocated(batch, a), lambda: torch_default_collate(batch)
        )


def test_allocator_returning_none_gives_torchs_result() -> None:
    batch = [
        {"x": torch.randn(3), "n": np.ones(2), "y": 1},
        {"x": torch.randn(3), "n": np.ones(2), "y": 2},
    ]
    allocator = BufferAllocator(refuse=True)
    ours = _allocated(batch, allocator)
    assert_same(ours, torch_default_collate(batch))
    assert len(allocator.calls) == 3
    assert not any(allocator.owns(t) for t in tensors_in(ours))


def test_allocator_returning_the_wrong_tensor_is_an_error() -> None:
    class Wrong:
        def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(1, dtype=torch.float64)

    with pytest.raises(ValueError) as info, allocating_into(Wrong()):
        default_collate([torch.ones(2), torch.ones(2)])
    assert str(info.value) == (
        "Wrong.empty((2, 2), torch.float32) returned Tensor torch.float64 torch.Size([1]); an "
        "allocator must return a torch.Tensor of exactly the requested shape and dtype, or "
        "None when it cannot."
    )


def test_allocating_into_nests_and_restores() -> None:
    outer, inner = BufferAllocator(), BufferAllocator()
    with allocating_into(outer):
        with allocating_into(inner):
            assert current_allocator() is inner
            with allocating_into(None):
                assert current_allocator() is None
            assert current_allocator() is inner
        assert current_allocator() is outer
    assert current_allocator() is None
    with pytest.raises(KeyError), allocating_into(outer):
        raise KeyError("boom")
    assert current_allocator() is None


def test_allocator_is_per_thread() -> None:
    mine = BufferAllocator()
    both_inside = threading.Barrier(2, timeout=10)
    seen: list[Any] = []

    def other_thread() -> None:
        theirs = BufferAllocator()
        with allocating_into(theirs):
            both_inside.wait()
            seen.append(current_allocator() is theirs)
            seen.append(theirs.owns(default_collate([torch.ones(2), torch.ones(2)])))
            both_inside.wait()

    thread = threading.Thread(target=other_thread, daemon=True)
    with allocating_into(mine):
        thread.start()
        both_inside.wait()
        assert current_allocator() is mine
        assert mine.owns(default_collate([torch.ones(3), torch.ones(3)]))
        both_inside.wait()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert seen == [True, True]
    assert len(mine.calls) == 1


# ---------------------------------------------------------------- NOTE [ Interleaved samples ]


def _hwc_views(dtype: torch.dtype, n: int = 4, size: int = 96) -> list[torch.Tensor]:
    # what torch.from_numpy(decoded_image).permute(2, 0, 1) gives: channels 3 elements apart
    return [
        (torch.rand(size, size, 3) * 255).to(dtype).permute(2, 0, 1) for _ in range(n)
    ]


@pytest.mark.parametrize(
    "dtype",
    [torch.uint8, torch.float32, torch.float16, torch.int64, torch.bool, torch.complex64],
)
def test_interleaved_views_stack_like_torch_with_and_without_allocator(
    dtype: torch.dtype,
) -> None:
    batch = _hwc_views(dtype)
    assert 1 < batch[0].stride(-1) <= 16  # the layout the numpy copy is for
    check(batch)
    allocator = BufferAllocator(nbytes=1 << 24)
    out = _allocated(batch, allocator)
    assert allocator.owns(out) and allocator.calls == [((4, 3, 96, 96), dtype)]
    assert_same(out, torch_default_collate(batch))


@pytest.mark.parametrize(
    "batch",
    [
        [t.conj() for t in _hwc_views(torch.complex64)],  # numpy() refuses the conj bit
        [t._neg_view() for t in _hwc_views(torch.float32)],  # ... and the neg bit
        [*_hwc_views(torch.float32, 2), torch.rand(3, 96, 96)],  # mixed strides
        [*_hwc_views(torch.float32, 2), *_hwc_views(torch.float64, 1)],  # mixed dtypes
        [*_hwc_views(torch.float32, 2), torch.rand(3, 96, 97)],  # torch's shape error
        [t.requires_grad_() for t in _hwc_views(torch.float32)],
        _hwc_views(torch.bfloat16),  # no numpy dtype
    ],
)
def test_interleaved_views_numpy_cannot_copy_take_torchs_path(batch: Any) -> None:
    check(batch)
    for allocator in (BufferAllocator(nbytes=1 << 24), BufferAllocator(refuse=True)):
        assert_same_outcome(
            lambda a=allocator: _allocated(batch, a), lambda: torch_default_collate(batch)
        )
