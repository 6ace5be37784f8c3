"""Batched fetch for datasets that index like arrays: one ``dataset[indices]`` call per batch.

NOTE [ Vectorised fetch ]
Many in-memory datasets are thin wrappers over tensors or arrays (``{"x": self.x[i], "y":
self.y[i]}``, ``TensorDataset``, a bare tensor or ndarray). Called with a LongTensor of a
batch's indices, such a ``__getitem__`` returns the whole batch at once, with no per-sample
Python at all. Whether a dataset is like that cannot be read off its code, so it is measured:
once the concurrency tuner has found the fetches CPU-bound (never for I/O-bound datasets), on
two batches (collated with the default collate, auto-batching on, no ``__getitems__``, no
error policy) the worker computes the batch both ways and compares them
leaf by leaf (type, dtype, shape, every value), after shaping the vectorised result as
``default_collate`` would (plain tuples become lists, numeric arrays tensors). Any difference,
any exception, any warning, or any draw from a global RNG means the dataset is fetched
sample by sample forever after; identical results mean the rest of the epoch is fetched in
one call per batch. Results are the same either way; what changes is how many times
``__getitem__`` is called.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from stoker.executors.concurrency import rng_fingerprint, rng_touched

_PROBES = 2


def shape_like_collate(obj: Any) -> Any:
    """Give a vectorised batch default_collate's container types."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc":
        return torch.as_tensor(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return [shape_like_collate(v) for v in obj]
    if isinstance(obj, tuple):
        return type(obj)(*(shape_like_collate(v) for v in obj))
    if isinstance(obj, list):
        return [shape_like_collate(v) for v in obj]
    if isinstance(obj, dict):
        return {k: shape_like_collate(v) for k, v in obj.items()}
    return obj


def same_batch(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and bool(
            torch.equal(a, b)
        )
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(same_batch(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True))
    return False  # strings, numbers, custom types: not a vectorisable batch


class VectorProbe:
    """Decides, from the first batches, whether ``dataset[index_tensor]`` gives the batch."""

    def __init__(self, dataset: Any, eligible: bool) -> None:
        self._dataset = dataset
        self._left = _PROBES if eligible else 0
        self.adopted = False

    @property
    def probing(self) -> bool:
        return self._left > 0

    def check(self, indices: list[int], collated: Any) -> None:
        """After fetching a batch the plain way: does one vectorised call give the same?"""
        self._left -= 1
        before = rng_fingerprint()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                candidate = shape_like_collate(self._dataset[torch.as_tensor(indices)])
        except Exception:
            self._left = 0
            return
        if rng_touched(before) or not same_batch(collated, candidate):
            self._left = 0
            return
        if self._left == 0:
            self.adopted = True

    def fetch(self, indices: list[int]) -> Any:
        return shape_like_collate(self._dataset[torch.as_tensor(indices)])
