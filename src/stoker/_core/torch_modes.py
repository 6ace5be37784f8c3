"""The program's torch modes see torch's calls, not stoker's.

NOTE [ The program's torch modes see torch's calls ]
A ``TorchFunctionMode`` or ``TorchDispatchMode`` the program has active while it iterates
(``torch.set_default_device``, ``with torch.device(...)``, a counting or logging mode, a
``FakeTensorMode``) sees every torch call made on its thread, and a worker forked while one
is active starts with it. Under torch's DataLoader that is torch's own calls: the base seed's
``empty``/``random_``/``item``, the sampler's ``randperm(...).tolist()``, the fetch and
``default_collate``, the pickling and rebuild of a worker's batch, and the profiler range of
every ``next()`` (``profiler_range``). stoker's bookkeeping (its statistics, RNG-state copies,
the gathers' and the transport's own tensors) is not among them: a mode would count calls
torch never makes, and a factory function could go to the mode's device. So stoker either
makes torch's calls (the sampler's fast path reads ``tolist()`` while a mode is active, the
gathers decline) or makes its own under ``unseen()``, which hides them from both kinds of
mode while one is active and costs two C calls when none is. A profiler that records sees the
calling thread's operators whatever a mode sees, so the gathers decline while one records
(``profiling``): its trace lists torch's operators. What torch makes at ``next()`` in the
calling thread (the rebuild of a worker's batch) stoker makes there too: the program's
``inference_mode`` and grad mode at that call are the batch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["modes_active", "profiler_range", "profiling", "subclass_unseen", "unseen", "watched"]

_NONE = contextlib.nullcontext()


def modes_active() -> bool:
    """A ``TorchFunctionMode``/``TorchDispatchMode`` is active on this thread (``with
    torch.device(...)`` is one: it would move the outputs of factory functions)."""
    return bool(torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack())


@contextlib.contextmanager
def _hidden() -> Iterator[None]:
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        yield


_profiler_enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
_record_functions = getattr(torch._C._autograd, "_enable_record_function", None)


def profiling() -> bool:
    """Whether a torch profiler records now (a C call: cheap enough for every batch)."""
    return _profiler_enabled is not None and bool(_profiler_enabled())


def watched() -> bool:
    """A mode or a recording profiler sees this thread's torch calls: where stoker's own
    calls would differ from torch's, it makes torch's."""
    return modes_active() or profiling()


@contextlib.contextmanager
def _unrecorded() -> Iterator[None]:
    """This thread's operators not recorded by the profiler (torch has no getter for the
    switch; it is on unless a program turned it off, which a profiled program does not)."""
    assert _record_functions is not None
    _record_functions(False)
    try:
        with _hidden():
            yield
    finally:
        _record_functions(True)


def unseen(when: bool = True, recorded: bool = False) -> Any:
    """``with unseen():`` stoker's own torch calls, hidden from the program's active modes
    and from a profiler that records (``when=False``: not hidden, for calls torch's path makes
    where stoker makes them; ``recorded=True``: hidden from the modes only, for what torch
    does in its pin thread, which a profiler records and a mode does not see)."""
    if not when:
        return _NONE
    if not recorded and _record_functions is not None and profiling():
        return _unrecorded()
    return _hidden() if modes_active() else _NONE


def subclass_unseen() -> Any:
    """``with subclass_unseen():`` stoker's reads of a tensor subclass's sizes, not seen by
    its ``__torch_function__`` (torch's path never asks it)."""
    return torch._C.DisableTorchFunctionSubclass()


def profiler_range(name: str) -> Any:
    """The range torch's ``_BaseDataLoaderIter.__next__`` opens on every call, by torch's
    module path as torch resolves it (a profiler, TensorBoard's DataLoader view and an active
    mode see torch's ``record_function``)."""
    return torch.autograd.profiler.record_function(name)
