"""Code of torch's that a program patches between epochs, for the differential fuzzer.

A program may wrap torch's own code (``functools.wraps``, the usual way): a sampler's
``__iter__``, a dataset class's ``__getitem__``, ``torch.stack``, or a function torch's path
never calls (``torch.index_select``: under torch the wrapper changes nothing). torch then calls the
program's version, in the main process and in workers forked after the patch; stoker's fast
paths for torch's code must notice (NOTE [ torch's own functions ]). Each patch here changes
what it returns in a way the record shows, keeps it valid (indices in range, the same
dtypes), and is undone when the case's run ends (``patch`` returns the undo).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, TensorDataset

__all__ = ["PATCHES", "patch"]


def _mirrored_indices(stock: Any) -> Any:
    @functools.wraps(stock)
    def __iter__(self: Any) -> Any:
        n = len(self.data_source)
        for i in stock(self):
            yield n - 1 - i
    return __iter__


def _reversed_batches(stock: Any) -> Any:
    @functools.wraps(stock)
    def __iter__(self: Any) -> Any:
        for batch in stock(self):
            yield batch[::-1]
    return __iter__


def _floats_plus_one(stock: Any) -> Any:
    @functools.wraps(stock)
    def __getitem__(self: Any, index: Any) -> Any:
        return tuple(t + 1 if t.is_floating_point() else t for t in stock(self, index))
    return __getitem__


def _stacked_plus_one(stock: Any) -> Any:
    @functools.wraps(stock)
    def stack(*args: Any, **kwargs: Any) -> Any:
        out = stock(*args, **kwargs)
        if out.is_floating_point() and not out.requires_grad:
            out.add_(1)
        return out
    return stack


PATCHES: dict[str, tuple[Any, str, Callable[[Any], Any]]] = {
    "RandomSampler.__iter__": (RandomSampler, "__iter__", _mirrored_indices),
    "SequentialSampler.__iter__": (SequentialSampler, "__iter__", _mirrored_indices),
    "BatchSampler.__iter__": (BatchSampler, "__iter__", _reversed_batches),
    "TensorDataset.__getitem__": (TensorDataset, "__getitem__", _floats_plus_one),
    "torch.stack": (torch, "stack", _stacked_plus_one),
    # one torch's path never calls (stoker's gathers' own: they must not call the program's)
    "torch.index_select": (torch, "index_select", _stacked_plus_one),
}


def patch(name: str) -> Callable[[], None]:
    """Apply the patch ``name``; returns what undoes it."""
    owner, attr, make = PATCHES[name]
    had = attr in vars(owner)
    stock = vars(owner)[attr] if had else getattr(owner, attr)
    setattr(owner, attr, make(getattr(owner, attr)))

    def undo() -> None:
        if had:
            setattr(owner, attr, stock)
        else:
            delattr(owner, attr)
    return undo
