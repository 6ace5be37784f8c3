"""The per-thread *current allocator* collate writes batch tensors into.

See NOTE [ Collating into shared memory ] in ``stoker._core.protocols``. The allocator is
per thread (``threading.local``): a thread executor runs several batches at once in one
process, and each thread must only ever write into its own batch's slab.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from stoker._core.protocols import Allocator

__all__ = ["allocating_into", "current_allocator"]


class _Local(threading.local):
    allocator: Allocator | None = None


_local = _Local()


def current_allocator() -> Allocator | None:
    """The allocator set by the innermost ``allocating_into`` on this thread, or ``None``."""
    return _local.allocator


@contextmanager
def allocating_into(allocator: Allocator | None) -> Iterator[Allocator | None]:
    """Make ``allocator`` the current allocator of this thread until the block exits.

    Nests: the previous allocator is restored on exit. ``None`` turns allocation off inside.
    """
    previous = _local.allocator
    _local.allocator = allocator
    try:
        yield allocator
    finally:
        _local.allocator = previous


def request(allocator: Allocator, shape: tuple[int, ...], dtype: torch.dtype) -> Any | None:
    """Ask ``allocator`` for an output tensor and check it is what was asked for."""
    out = allocator.empty(shape, dtype)
    if out is None:
        return None
    if type(out) is not torch.Tensor or out.dtype != dtype or out.shape != shape:
        got = f"{type(out).__name__} {getattr(out, 'dtype', '?')} {getattr(out, 'shape', '?')}"
        raise ValueError(
            f"{type(allocator).__name__}.empty({shape}, {dtype}) returned {got}; an allocator "
            "must return a torch.Tensor of exactly the requested shape and dtype, or None "
            "when it cannot."
        )
    return out
