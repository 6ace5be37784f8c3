"""The values a batched ``__getitem__`` computes (NOTE [ Batched getitem from source ] in
``batched_getitem``): columns of per-sample values, and the batch being computed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stoker.collate._alloc import current_allocator, request

_MISSING = object()


class Decline(Exception):
    """This batch is not exactly computable here: fetch it sample by sample."""


class _Unsupported(Exception):
    """The source is not of the supported form: there is no batched getitem."""


# -- columns: the values of one leaf expression for every sample of the batch ----------------


class _Array:
    """Per-sample values stacked on dim 0: a tensor or an ndarray (maybe not yet gathered)."""

    __slots__ = ("_data", "_source", "_rows")

    def __init__(self, data: Any = None, source: Any = None, rows: Any = None) -> None:
        self._data, self._source, self._rows = data, source, rows

    @property
    def data(self) -> Any:
        if self._data is None:  # the gather: index_select / take are ~2x advanced indexing
            src, rows = self._source, self._rows
            if isinstance(src, torch.Tensor) and isinstance(rows, torch.Tensor):
                self._data = torch.index_select(src, 0, rows)
            elif isinstance(src, np.ndarray) and isinstance(rows, np.ndarray):
                self._data = np.take(src, rows, axis=0)
            else:
                self._data = src[rows]
        return self._data

    def leaf(self) -> torch.Tensor:
        """The collated leaf; a pending gather writes straight into the current slab."""
        if self._data is None and isinstance(self._rows, torch.Tensor | np.ndarray):
            src = self._source
            shape = (len(self._rows), *src.shape[1:])
            dtype = src.dtype if isinstance(src, torch.Tensor) else _torch_dtype(src.dtype)
            allocator = current_allocator()
            out = None if allocator is None else request(allocator, shape, dtype)
            if out is not None:
                if isinstance(src, torch.Tensor):
                    torch.index_select(src, 0, torch.as_tensor(self._rows), out=out)
                else:  # rows are checked in range: "clip" only skips numpy's buffered copy
                    np.take(src, self._rows, axis=0, out=out.numpy(), mode="clip")
                return out
        data = self.data
        return data if isinstance(data, torch.Tensor) else torch.as_tensor(data)

    def tensor(self) -> torch.Tensor:
        data = self.data
        return data if isinstance(data, torch.Tensor) else torch.from_numpy(data)


class _Scalars:
    """One Python scalar per sample, kept as the tensor ``default_collate`` makes of them:
    int64 for ints, float64 for floats, bool for bools."""

    __slots__ = ("values",)

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values


class _Items:
    """Per-sample Python objects (from a list or tuple attribute), collated as they are."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


# -- the batch being computed ---------------------------------------------------------------


class _Batch:
    __slots__ = ("dataset", "indices", "_rows_t", "_rows_np", "_lo", "_hi")

    def __init__(self, dataset: Any, indices: list[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        self._rows_t: torch.Tensor | None = None
        self._rows_np: np.ndarray | None = None
        self._lo = self._hi = 0

    def rows_tensor(self) -> torch.Tensor:
        if self._rows_t is None:  # numpy builds it from a list ~3x faster than torch.tensor
            self._rows_np = np.array(self.indices, dtype=np.int64)
            self._rows_t = torch.from_numpy(self._rows_np)
            self._lo, self._hi = min(self.indices), max(self.indices)
        return self._rows_t

    def rows_for(self, source: Any) -> Any:
        """The indices to gather ``source``'s rows with; declines unless all are in range."""
        rows = self.rows_tensor()
        if self._lo < 0 or self._hi >= len(source):
            raise Decline  # negative or out of range: let one sample's indexing speak
        return rows if isinstance(source, torch.Tensor) else self._rows_np


def _array_source(source: Any) -> bool:
    if type(source) is torch.Tensor:
        return (source.device.type == "cpu" and source.layout == torch.strided
                and not source.requires_grad and not source.is_quantized and source.dim() > 0)
    if type(source) in (np.ndarray, np.memmap):
        return source.dtype.kind in "biufc" and source.ndim > 0
    return False


Node = Callable[[_Batch], Any]
