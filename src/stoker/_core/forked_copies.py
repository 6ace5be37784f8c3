"""Finalizers that run only in the process that made what they stop.

NOTE [ A forked child leaves its parent's things alone ]
A process forked from one that holds stoker objects (a rank started by fork, another loader's
worker, a ``multiprocessing`` pool) has a copy of each. When the child's collector frees a copy
that was cyclic garbage at the fork, its ``weakref.finalize`` runs there: an iterator's would
ask the parent's workers to stop over the inherited sockets and wait 5 s for processes that are
not the child's to join (measured: 15 s in a child's first full collection with three such
iterators, and the parent's next batch raised WorkerDiedError; a candidate, unconfirmed, for
a rank of tests/integration/test_distributed.py forked from pytest hanging once in CI), and a
batch's or a slab bank's would take locks another thread of the parent may have held at the
fork. The parent owns all of it and stops it itself; the child's copies vanish with the child.
So every finalizer that gives slabs back or unmaps them is made here (``finalize_here``), and
does nothing in any other process; ``WorkerGroup.stop``, which an iterator's finalizer and its
own shutdown both call, checks the pid it was made in itself. Remote handles check their own
pid (NOTE [ Remote handles after fork ]), and the prefetcher too; closing a duplicated fd in a
child is harmless and stays.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any


def in_this_process(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, run only when called in the process that called this; elsewhere a no-op."""
    pid = os.getpid()

    def run(*args: Any, **kwargs: Any) -> Any:
        if os.getpid() == pid:
            return fn(*args, **kwargs)
        return None

    return run


def finalize_here(obj: object, fn: Callable[..., Any], *args: Any) -> weakref.finalize:
    """``weakref.finalize(obj, fn, *args)`` that does nothing when run in a forked child."""
    return weakref.finalize(obj, in_this_process(fn), *args)


# NOTE [ A forked copy of a live iterator says what torch's says ]
# A worker iterator that is cyclic garbage while its workers still run (a trainer object that
# refers to itself, holding an iterator mid-epoch) is copied into each process forked before
# the collector frees it: a later loader's workers, a program's own fork. Where the collector
# frees that copy, torch's ``__del__`` shuts its workers down from a process that is not their
# parent: ``multiprocessing`` asserts ("can only test a child process") and the interpreter
# prints "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ ...>" and
# that AssertionError on the copy's stderr. stoker's copy leaves the parent's workers alone
# (above), so ``say_as_torchs_copy`` makes an object of torch's class holding the copy's
# process objects, and none of the queues or events whose shutdown would reach the parent's
# workers, and drops it: torch's own ``__del__`` runs, asserts in torch's frames and is
# reported at that moment, as it would be under torch. An iterator whose workers had already
# stopped when the process forked (its epoch ended, its loader deleted) says nothing, under
# torch too.


def say_as_torchs_copy(processes: list[Any]) -> None:
    """What torch's worker iterator says when a forked copy of it, its workers still running
    in the parent, is freed (NOTE [ A forked copy of a live iterator says what torch's
    says ]); ``processes``: the copy's ``multiprocessing`` process objects of its workers."""
    import threading

    from torch.utils.data import dataloader

    copy = object.__new__(dataloader._MultiProcessingDataLoaderIter)
    copy._shutdown = False
    copy._persistent_workers = False
    copy._workers_status = [False] * len(processes)  # nothing sent to the parent's workers
    copy._workers_done_event = threading.Event()  # type: ignore[assignment]  # not the parent's
    copy._workers = processes
    copy._index_queues = []
    copy._worker_pids_set = False
    del copy  # torch's __del__, now
