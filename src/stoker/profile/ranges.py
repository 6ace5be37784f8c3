"""The loader's waits and stages as named ranges in the user's ``torch.profiler`` trace.

Only while a profiler is recording: ``stage_range`` then opens a
``torch.autograd.profiler.record_function`` range; otherwise it returns one shared
``nullcontext`` and costs a C call and a ``with`` per batch.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

_OFF = contextlib.nullcontext()
_enabled = getattr(torch._C._autograd, "_profiler_enabled", None)


def profiling() -> bool:
    """Whether a torch profiler records now (a C call: cheap enough for every batch)."""
    return _enabled is not None and bool(_enabled())


def stage_range(name: str) -> Any:
    """``with stage_range("stoker: ..."):`` a profiler range when one records, else nothing."""
    if _enabled is None or not _enabled():
        return _OFF
    return torch.autograd.profiler.record_function(name)


WAIT = "stoker: next()"  # waiting for the batch; receiving and pinning it are nested
UNPACK = "stoker: receive batch from worker"
PIN = "stoker: pin batch"
FETCH = "stoker: fetch (dataset __getitem__)"
COLLATE = "stoker: collate"
