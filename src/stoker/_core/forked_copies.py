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
