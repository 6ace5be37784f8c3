"""Leaf collate functions: tensors, numpy arrays and scalars, Python numbers, strings.

Each gives exactly what torch's function of the same job gives (values, dtype, shape, type,
errors). Two things differ on purpose, neither visible in the result:

* with a current allocator (``allocating_into``) the output tensor lives in the allocator's
  memory;
* batches of same-shape numeric ndarrays and of plain ``int``/``float``/``bool`` skip torch's
  per-element conversion: one output allocation, one C-level copy.

NOTE [ Collate in a worker is torch's in-worker collate ]
Inside a worker (``torch.utils.data.get_worker_info()`` is set, as stoker's workers set it)
torch's ``collate_tensor_fn`` stacks into a shared-memory ``out=`` tensor made from the first
sample: the batch takes the first sample's dtype (int32 then int64 gives int32, int64 values
wrapped), a dtype that cannot be cast to it raises TypeError, a non-tensor raises
AttributeError (``numel``), and shapes too small for the first one's raise "Trying to resize
storage that is not resizable". We give the same: a batch of one dtype (the common case) is
stacked as before, into the slab; a plain stack that fails or changes the dtype, a tensor
subclass, or inputs that need grad (``out=`` refuses them) is collated by torch's own function,
and the result copied into the slab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils import collate as _torch_collate
from torch.utils.data._utils.worker import get_worker_info as _torch_worker_info

from stoker.collate import _alloc
from stoker.errors import MixedDeviceError

CollateFnMap = Mapping[Any, Callable[..., Any]]

# torch's exact text, so code that matches on it keeps working.
ERR_MSG_FORMAT = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)
_NESTED_MSG = (
    "Batches of nested tensors are not currently supported by the default collate_fn; "
    "please provide a custom collate_fn to handle them appropriately."
)
_SPARSE_MSG = (
    "Batches of sparse tensors are not currently supported by the default collate_fn; "
    "please provide a custom collate_fn to handle them appropriately."
)
_SPARSE_LAYOUTS = frozenset(
    {torch.sparse_coo, torch.sparse_csr, torch.sparse_bsr, torch.sparse_csc, torch.sparse_bsc}
)
# Dtypes an allocator is asked for; anything exotic (quantized, float8) just allocates normally.
_PLAIN_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16}
    | {torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64}
    | {torch.complex64, torch.complex128}
)
# Stacking straight into the allocator's tensor needs a Python-level check of every element
# (~140 ns each); stacking then copying costs a memcpy of the batch instead (~0.2 ns/byte).
# Direct pays off from about 1 KiB per element.
_DIRECT_STACK_MIN_ELEM_BYTES = 1024

# numpy dtype -> torch dtype for arrays torch.as_tensor accepts as they are (native byte
# order); any other dtype takes torch's own path and so gets torch's own error.
# (Written out, not read from torch.from_numpy at import: NOTE [ The program's torch modes see
# torch's calls ], a module may be imported first inside the program's mode.)
_NP_TO_TORCH: dict[np.dtype[Any], torch.dtype] = {
    np.dtype(np_type): torch_type for np_type, torch_type in (
        (np.bool_, torch.bool), (np.int8, torch.int8), (np.int16, torch.int16),
        (np.int32, torch.int32), (np.int64, torch.int64), (np.uint8, torch.uint8),
        (np.uint16, torch.uint16), (np.uint32, torch.uint32), (np.uint64, torch.uint64),
        (np.float16, torch.float16), (np.float32, torch.float32), (np.float64, torch.float64),
        (np.complex64, torch.complex64), (np.complex128, torch.complex128),
    )
}
_ARRAY_TYPES = frozenset({np.ndarray, np.memmap})
_STR_OBJ_KINDS = frozenset("SaUO")
_dtype_of = attrgetter("dtype")
_shape_of = attrgetter("shape")
_strides_of = attrgetter("strides")


def collate_tensor_fn(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Stack tensors along a new first dimension."""
    elem = batch[0]
    if elem.is_nested:
        raise RuntimeError(_NESTED_MSG)
    if elem.layout in _SPARSE_LAYOUTS:
        raise RuntimeError(_SPARSE_MSG)
    allocator = _alloc.current_allocator()
    in_worker = _torch_worker_info() is not None
    try:
        if allocator is None:
            if _interleaved_batch(batch, elem):
                out = torch.empty((len(batch), *elem.shape), dtype=elem.dtype)
                if _copy_interleaved(batch, out):
                    return out
            return _stacked(batch, elem, in_worker)
        return _stack_with(allocator, batch, elem, in_worker)
    except RuntimeError:
        _raise_if_mixed_devices(batch)
        raise


def raise_if_mixed_devices_in(samples: Any) -> None:
    """After a collate failed: if some leaf's tensors are on different devices across the
    samples (a list of dicts, tuples, tensors), raise ``MixedDeviceError`` naming who is
    where; torch's own message only says which device was expected."""
    if not isinstance(samples, list) or not samples:
        return
    first = samples[0]
    if isinstance(first, torch.Tensor):
        _raise_if_mixed_devices(samples)
    elif isinstance(first, Mapping):
        for key in first:
            if all(isinstance(s, Mapping) and key in s for s in samples):
                raise_if_mixed_devices_in([s[key] for s in samples])
    elif isinstance(first, (tuple, list)):
        if all(isinstance(s, (tuple, list)) and len(s) == len(first) for s in samples):
            for k in range(len(first)):
                raise_if_mixed_devices_in([s[k] for s in samples])


def _raise_if_mixed_devices(batch: Any) -> None:
    """Turn torch's terse device mismatch into an error naming who is where (after failing)."""
    positions: dict[str, list[int]] = {}
    for i, t in enumerate(batch):
        if isinstance(t, torch.Tensor):
            positions.setdefault(str(t.device), []).append(i)
    if len(positions) > 1:
        raise MixedDeviceError(positions) from None


def _stacked(batch: Any, elem: torch.Tensor, in_worker: bool) -> Any:
    """``torch.stack(batch, 0)``; in a worker, what torch's in-worker collate gives (NOTE
    [ Collate in a worker is torch's in-worker collate ])."""
    if not in_worker:
        return torch.stack(batch, 0)
    try:
        result = torch.stack(batch, 0)
    except Exception:
        result = None
    if (
        type(result) is torch.Tensor
        and result.dtype == elem.dtype
        and not result.requires_grad
    ):
        return result  # every sample cast to the first one's dtype: the values torch's out= gets
    return _torch_collate.collate_tensor_fn(batch)


def _stack_with(allocator: Any, batch: Any, elem: torch.Tensor, in_worker: bool = False) -> Any:
    dtype = elem.dtype
    n = len(batch)
    if (
        elem.numel() * elem.element_size() >= _DIRECT_STACK_MIN_ELEM_BYTES
        and dtype in _PLAIN_DTYPES
        and elem.is_cpu
        and _only(map(type, batch), torch.Tensor)
        and _only(map(_dtype_of, batch), dtype)  # stack(out=) would silently cast a stray dtype
    ):
        out = _alloc.request(allocator, (n, *elem.shape), dtype)
        if out is not None:
            if _interleaved_batch(batch, elem) and _copy_interleaved(batch, out):
                return out
            try:
                return torch.stack(batch, 0, out=out)
            except RuntimeError:
                pass  # plain stack below raises torch's error, or works (inputs need grad)
    return place(_stacked(batch, elem, in_worker), allocator)


# NOTE [ Interleaved samples ]
# The commonest image sample is a view: ``torch.from_numpy(hwc).permute(2, 0, 1)`` (and
# torchvision's PILToTensor), whose channels sit 3 bytes apart. torch.stack copies such
# views with a scalar strided loop; numpy's strided copy of the same bytes takes about 20 %
# less time (uint8 224x224x3: ~70 vs ~86 us per sample; float32: ~190 vs ~240 us), while for
# other layouts (a transposed matrix, whose elements sit a row apart) torch is as fast or
# faster. So only same-shape, same-strides, numpy-representable CPU views whose innermost
# dimension reads elements 2..16 apart, of at least 16 KiB each, are copied sample by sample
# through numpy. A copy is a copy: the bytes, dtype and shape are torch.stack's.
_INTERLEAVED_MIN_ELEM_BYTES = 16 << 10
_INTERLEAVED_MAX_STRIDE = 16
_NUMPY_DTYPES = _PLAIN_DTYPES - {torch.bfloat16, torch.uint16, torch.uint32, torch.uint64}


def _interleaved_batch(batch: Any, elem: torch.Tensor) -> bool:
    if (
        elem.dim() == 0
        or not 1 < elem.stride(-1) <= _INTERLEAVED_MAX_STRIDE
        or elem.dtype not in _NUMPY_DTYPES
        or elem.numel() * elem.element_size() < _INTERLEAVED_MIN_ELEM_BYTES
        or not elem.is_cpu
        or elem.requires_grad
    ):
        return False
    stride, shape, dtype = elem.stride(), elem.shape, elem.dtype
    return all(
        type(t) is torch.Tensor and t.dtype == dtype and t.shape == shape
        and t.stride() == stride and not t.requires_grad
        for t in batch
    )


def _copy_interleaved(batch: Any, out: torch.Tensor) -> bool:
    """Copy each sample into its row of ``out`` through numpy; False: use torch.stack."""
    try:
        rows = out.numpy()
        for row, t in zip(rows, batch, strict=True):
            np.copyto(row, t.numpy(), casting="no")
    except (RuntimeError, TypeError):  # conj/neg bit, a tensor subclass numpy() refuses
        return False
    return True


def place(result: Any, allocator: Any) -> Any:
    """Copy a freshly made batch tensor into the allocator's memory when it can hold it."""
    if (
        type(result) is not torch.Tensor
        or result.dtype not in _PLAIN_DTYPES
        or result.requires_grad
        or not result.is_cpu
        or result.layout is not torch.strided
    ):
        return result
    out = _alloc.request(allocator, tuple(result.shape), result.dtype)
    if out is None:
        return result
    return out.copy_(result)


def is_str_or_object(dtype: np.dtype[Any]) -> bool:
    """torch's test for arrays it will not convert: bytes, str or object items."""
    return not _STR_OBJ_KINDS.isdisjoint(dtype.str)


def stacks_as_tensors(collate_fn_map: CollateFnMap | None) -> bool:
    # torch collates the converted tensors through the map: only when that reaches a stock
    # tensor function may the arrays be copied straight into the output.
    fn = None if collate_fn_map is None else collate_fn_map.get(torch.Tensor)
    return fn is not None and id(fn) in STOCK_TENSOR_FN_IDS


def stack_arrays(batch: Sequence[Any], elem: np.ndarray[Any, Any]) -> Any | None:
    """All same-type/dtype/shape arrays torch.as_tensor takes as-is -> one tensor, else None."""
    dtype = _NP_TO_TORCH.get(elem.dtype)
    if (
        dtype is None
        or not _ARRAY_TYPES.issuperset(map(type, batch))
        or not _only(map(_dtype_of, batch), elem.dtype)
        or not _only(map(_shape_of, batch), elem.shape)
        or not _strides_ok(batch, elem.itemsize)
    ):
        return None
    n = len(batch)
    shape = (n, *elem.shape)
    allocator = _alloc.current_allocator()
    out = None if allocator is None else _alloc.request(allocator, shape, dtype)
    if out is None:
        out = torch.empty(shape, dtype=dtype)
    dst = out.numpy()
    if elem.ndim:
        np.concatenate(batch, axis=0, out=dst.reshape(n * elem.shape[0], *elem.shape[1:]))
    else:
        np.stack(batch, axis=0, out=dst)
    return out


def _strides_ok(batch: Sequence[Any], itemsize: int) -> bool:
    # torch.as_tensor rejects negative strides and strides that are not whole elements.
    return all(s >= 0 and s % itemsize == 0 for st in set(map(_strides_of, batch)) for s in st)


def _only(values: Any, expected: Any) -> bool:
    uniq = set(values)
    return len(uniq) == 1 and expected in uniq


def collate_numpy_scalar_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """numpy scalars -> a 1-d tensor of their (promoted) dtype."""
    return _placed(torch.as_tensor(batch))


def collate_float_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python floats -> float64 tensor."""
    if _only(map(type, batch), float):
        return _placed(torch.from_numpy(np.array(batch, dtype=np.float64)))
    return _placed(torch.tensor(batch, dtype=torch.float64))


def collate_int_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python ints -> int64 tensor (all ``bool`` -> bool tensor; a float among them -> default
    float dtype), by torch.tensor's own inference."""
    kinds = set(map(type, batch))
    if len(kinds) == 1 and (kind := kinds.pop()) in (int, bool):
        try:
            array = np.array(batch, dtype=np.int64 if kind is int else np.bool_)
        except OverflowError:
            pass  # beyond int64: torch.tensor below raises torch's own error
        else:
            return _placed(torch.from_numpy(array))
    return _placed(torch.tensor(batch))


def collate_str_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """str/bytes stay as they are: the batch itself is returned."""
    return batch


def _placed(result: torch.Tensor) -> Any:
    allocator = _alloc.current_allocator()
    return result if allocator is None else place(result, allocator)


# By id: a user's map value may be any callable, hashable or not.
STOCK_TENSOR_FN_IDS = frozenset({id(collate_tensor_fn), id(_torch_collate.collate_tensor_fn)})
