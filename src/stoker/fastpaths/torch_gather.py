"""The gathers of NOTE [ torch's own datasets ] (in ``torch_datasets``): a batch of torch's
dataset classes as one ``index_select`` per output tensor.

``gather(dataset, indices)`` first resolves the batch through the dataset tree (``_resolve``):
each node checks its part of the NOTE and maps the indices as torch's code would (a
``Subset`` through its indices, a ``ConcatDataset`` through ``bisect_right`` over its
``cumulative_sizes``), giving the structure ``default_collate`` would return with, at each
tensor, where its rows come from. Then it builds the batch (``_build``): a tensor whose rows
all come from one source tensor is one ``index_select``; rows from several parts of a
``ConcatDataset`` are gathered per part into their positions. Whatever cannot be shown exact
raises ``Decline``, and so does any exception: the batch is then fetched sample by sample.
"""

from __future__ import annotations

import bisect
from array import array
from typing import Any

import torch
import torch.storage
import torch.utils.data.dataset
from torch.utils.data import ConcatDataset, StackDataset, Subset, TensorDataset, get_worker_info
from torch.utils.data._utils import collate as _torch_collate

from stoker._core.torch_modes import watched
from stoker._core.torch_own import (
    c_function,
    c_method,
    tensor_methods_own,
    torch_function_own,
    torchs_own,
)
from stoker.collate._alloc import current_allocator, request
from stoker.fastpaths.batched_columns import Decline

__all__ = ["PLAIN_DTYPES", "gather", "plain_tensor", "stock", "torch_calls_stock"]

# Per class: the methods torch's fetcher and these classes call, and whether torch has them.
_METHODS: dict[type, tuple[tuple[str, bool], ...]] = {
    TensorDataset: (("__getitem__", True), ("__getitems__", False), ("__len__", True)),
    StackDataset: (("__getitem__", True), ("__getitems__", True), ("__len__", True)),
    Subset: (("__getitem__", True), ("__getitems__", True), ("__len__", True)),
    ConcatDataset: (("__getitem__", True), ("__getitems__", False), ("__len__", True)),
}


def _stock_methods(cls: type) -> bool:
    for name, present in _METHODS[cls]:
        fn = getattr(cls, name, None)
        if not present:
            if fn is not None:
                return False
        elif not torchs_own(fn, torch.utils.data.dataset, name):
            return False
    return True


def stock(ds: Any) -> bool:
    """``ds`` is exactly one of torch's classes, with torch's own methods."""
    cls = type(ds)
    if cls is torch.Tensor:
        return True
    if cls not in _METHODS or not _stock_methods(cls):
        return False
    return "__getitems__" not in getattr(ds, "__dict__", {})

PLAIN_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128,
})
_MAX_DEPTH = 32
# The gathers' own calls, not torch's path's: torch's C functions and methods themselves, so a
# program's rebinding of these names sees nothing (NOTE [ torch's own functions ])
_frombuffer, _aminmax = c_function("frombuffer"), c_function("aminmax")
_empty, _index_select = c_function("empty"), c_function("index_select")
_set, _index_copy = c_method("set_"), c_method("index_copy_")
_cat, _argsort = c_function("cat"), c_function("argsort")


class _Idx:
    """A list of exact ints, with its int64 tensor and its bounds, made once."""

    __slots__ = ("hi", "lo", "tensor", "values")

    def __init__(self, values: list[int]) -> None:
        self.values = values
        # array('q') refuses what is not an int64 (OverflowError): the caller declines
        self.tensor = _frombuffer(array("q", values), dtype=torch.int64)
        lo, hi = _aminmax(self.tensor)
        self.lo, self.hi = int(lo), int(hi)


class _Rows:
    """One output tensor: ``parts`` of (source tensor, output positions or None for all in
    order, source rows)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[torch.Tensor, _Idx | None, _Idx]]) -> None:
        self.parts = parts


class _Seq:
    """A tuple sample (``default_collate`` returns a list) or a dict sample (``keys``)."""

    __slots__ = ("children", "keys")

    def __init__(self, children: list[Any], keys: tuple[Any, ...] | None = None) -> None:
        self.children = children
        self.keys = keys


def plain_tensor(t: Any) -> bool:
    """``t`` is a tensor the gathers read as rows: an exact dense CPU tensor of a plain dtype,
    at least 1-d, contiguous, with no grad, conjugate or negative bit, not nested."""
    return (
        type(t) is torch.Tensor and t.layout is torch.strided and t.device.type == "cpu"
        and not t.is_nested and t.dtype in PLAIN_DTYPES and t.dim() >= 1
        and not t.requires_grad and t.is_contiguous() and not t.is_conj() and not t.is_neg()
    )


def _plain(t: Any) -> torch.Tensor:
    if not plain_tensor(t):
        raise Decline("not a plain CPU tensor")
    return t


def _in_range(idx: _Idx, n: Any) -> None:
    if type(n) is not int or idx.lo < 0 or idx.hi >= n:
        raise Decline("an index out of range (or negative)")


def _tensor(t: Any, idx: _Idx) -> _Rows:
    t = _plain(t)
    _in_range(idx, t.shape[0])
    return _Rows([(t, None, idx)])


def _resolve(ds: Any, idx: _Idx, depth: int) -> Any:
    """The batch's structure for ``ds`` at ``idx`` (exact ints, checked here against ``ds``)."""
    if depth > _MAX_DEPTH or not stock(ds):
        raise Decline("not one of torch's dataset classes as torch defines it")
    cls = type(ds)
    if cls is torch.Tensor:
        return _tensor(ds, idx)
    if cls is TensorDataset:
        tensors = ds.tensors
        if type(tensors) not in (tuple, list) or not tensors:
            raise Decline("TensorDataset.tensors is not a tuple of tensors")
        return _Seq([_tensor(t, idx) for t in tensors])
    if cls is StackDataset:
        children = ds.datasets
        if type(children) is dict and children:
            return _Seq([_resolve(c, idx, depth + 1) for c in children.values()],
                        tuple(children))
        if type(children) is tuple and children:
            return _Seq([_resolve(c, idx, depth + 1) for c in children])
        raise Decline("StackDataset.datasets is not a tuple or dict")
    if cls is Subset:
        return _resolve(ds.dataset, _subset_rows(ds.indices, idx), depth + 1)
    if cls is ConcatDataset:
        return _concat(ds, idx, depth)
    raise Decline("unknown class")  # pragma: no cover - stock() admits only the above


def _subset_rows(indices: Any, idx: _Idx) -> _Idx:
    if type(indices) not in (list, tuple, range):
        raise Decline("Subset.indices is not a list, tuple or range")
    _in_range(idx, len(indices))
    rows = [indices[i] for i in idx.values]
    if type(indices) is not range and set(map(type, rows)) != {int}:
        raise Decline("Subset.indices holds something other than ints")
    return _Idx(rows)


def _concat(ds: Any, idx: _Idx, depth: int) -> Any:
    cum, datasets = ds.cumulative_sizes, ds.datasets
    if type(cum) is not list or type(datasets) is not list or len(cum) != len(datasets) or (
            not cum) or any(type(c) is not int for c in cum):
        raise Decline("ConcatDataset's sizes are not its own")
    _in_range(idx, cum[-1])
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for pos, i in enumerate(idx.values):  # torch's ConcatDataset.__getitem__, for i in [0, len)
        d = bisect.bisect_right(cum, i)
        positions, rows = groups.setdefault(d, ([], []))
        positions.append(pos)
        rows.append(i - cum[d - 1] if d else i)
    parts = [(_Idx(positions), _resolve(datasets[d], _Idx(rows), depth + 1))
             for d, (positions, rows) in groups.items()]
    if len(parts) == 1:
        return parts[0][1]  # every row from one part, in order
    return _merge(parts)


def _merge(parts: list[tuple[_Idx, Any]]) -> Any:
    """Samples of several parts in one batch: the same structure, rows to their positions."""
    first = parts[0][1]
    if isinstance(first, _Rows):
        merged: list[tuple[torch.Tensor, _Idx | None, _Idx]] = []
        for positions, node in parts:
            if not isinstance(node, _Rows):
                raise Decline("the parts' samples differ in structure")
            for t, pos, rows in node.parts:
                merged.append((t, positions if pos is None else _Idx(
                    [positions.values[p] for p in pos.values]), rows))
        return _Rows(merged)
    for _, node in parts:
        if not isinstance(node, _Seq) or node.keys != first.keys or len(
                node.children) != len(first.children):
            raise Decline("the parts' samples differ in structure")
    return _Seq([_merge([(positions, node.children[k]) for positions, node in parts])
                 for k in range(len(first.children))], first.keys)


def _empty_like_collate(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The output tensor where ``default_collate`` would put it: the batch's slab (stoker's
    transport), a new shared-memory storage in a worker (torch's ``collate_tensor_fn``), or
    ordinary memory."""
    allocator = current_allocator()
    if allocator is not None:
        out = request(allocator, shape, t.dtype)
        if out is not None:
            return out
    elif get_worker_info() is not None:
        # torch's collate_tensor_fn: ``elem._typed_storage()._new_shared(numel)``, which is
        # ``UntypedStorage._new_shared(numel * itemsize)`` wrapped in a TypedStorage, then
        # ``elem.new(storage).resize_(shape)``: that storage at offset 0, contiguous. The same
        # storage and tensor, without the TypedStorage wrapping (~8 us a tensor)
        numel = 1
        for s in shape:
            numel *= s
        storage = torch.UntypedStorage._new_shared(numel * t.element_size(), device=t.device)
        out = _empty((0,), dtype=t.dtype, device=storage.device)
        return _set(out, storage, 0, shape)
    return _empty(shape, dtype=t.dtype)


def _build(node: Any, n: int) -> Any:
    if isinstance(node, _Seq):
        values = [_build(c, n) for c in node.children]
        return values if node.keys is None else dict(zip(node.keys, values, strict=True))
    parts = node.parts
    first = parts[0][0]
    row_shape = first.shape[1:]
    for t, _, _ in parts:
        if t.dtype != first.dtype or t.shape[1:] != row_shape:
            raise Decline("rows of different dtypes or shapes in one batch")
    if current_allocator() is None and get_worker_info() is None:
        # Ordinary memory: made out of place, as torch.stack makes it (its version 0)
        if len(parts) == 1 and parts[0][1] is None:
            return _index_select(first, 0, parts[0][2].tensor)
        rows = _cat([_index_select(t, 0, r.tensor) for t, _, r in parts])
        at = _cat([positions.tensor for _, positions, _ in parts if positions is not None])
        return _index_select(rows, 0, _argsort(at))
    out = _empty_like_collate(first, (n, *row_shape))
    if len(parts) == 1 and parts[0][1] is None:
        return _index_select(first, 0, parts[0][2].tensor, out=out)
    for t, positions, rows_at in parts:
        assert positions is not None  # merged parts always say where their rows go
        _index_copy(out, 0, positions.tensor, _index_select(t, 0, rows_at.tensor))
    return out


# What torch's path for these classes calls through names a program can rebind: the samples'
# ``tensor[index]``, ``default_collate``'s recursion (the module's ``collate``) and
# ``collate_tensor_fn``'s ``torch.stack``, ``numel``, ``size``, ``_typed_storage()._new_shared``,
# ``new`` and ``resize_``.
_TENSOR_METHODS = ("__getitem__", "new", "resize_", "numel", "size", "is_nested", "layout",
                   "device", "dim", "element_size", "_typed_storage")


def torch_calls_stock() -> bool:
    """The functions torch's path for these classes calls are torch's own: where a program
    rebound one (``torch.stack = ...``), torch calls it for every batch, so the gathers decline."""
    return (torch_function_own("stack") and tensor_methods_own(_TENSOR_METHODS)
            and torchs_own(vars(torch.TypedStorage).get("_new_shared"), torch.storage,
                           "_new_shared")
            and torchs_own(_torch_collate.collate, _torch_collate, "collate"))


def gather(dataset: Any, indices: Any) -> Any:
    """``default_collate`` of the samples of ``dataset`` at ``indices``, gathered; ``Decline``
    where NOTE [ torch's own datasets ] does not hold for this batch."""
    if type(indices) is not list or not indices or set(map(type, indices)) != {int}:
        raise Decline("the batch is not a non-empty list of ints")
    if watched():
        raise Decline("a torch mode is active or a profiler records: they see torch's calls")
    if not torch_calls_stock():
        raise Decline("a function torch's path calls was rebound (torch.stack, Tensor methods, "
                      "default_collate's recursion)")
    try:
        return _build(_resolve(dataset, _Idx(indices), 0), len(indices))
    except Decline:
        raise
    except Exception as exc:  # torch's own path raises it (or gives what torch gives)
        raise Decline(f"{type(exc).__name__}: {exc}") from exc
