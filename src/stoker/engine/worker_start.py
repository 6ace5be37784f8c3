"""Start an iterator's worker processes: forked one after another, or spawned side by side.

NOTE [ Tasks before the next fork ]
Forking a worker costs the main process ~6 ms (its page tables), and workers are forked
one after another. Sending tasks only once all were forked left the first worker idle
for the forks after it, at the start of every epoch. So each worker of a map-style
dataset gets its first task as soon as it is forked (``prime``) if the round-robin cycle is at
it; the rest follow after the last fork, in the same order as before, so which worker loads
which batch does not change: at an epoch's start task k goes to worker k mod n, and a resumed
epoch starts the cycle where the saved run stopped (``TaskBook.start_turn_at``: position p to
worker p mod n, the first at ``batches`` mod n; NOTE [ Worker streams resume ]), so a worker
forked before the one whose turn it is gets its first task after the last fork. An
IterableDataset's tasks follow torch's round-robin cycle, which is only walked after every
fork.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import BaseContext

from stoker._core.specs import WorkerSpec
from stoker.engine.worker_group import WorkerGroup
from stoker.workers.launch import gc_frozen_for_fork, start_worker
from stoker.workers.spec_once import PickledSpec
from stoker.workers.thread_caps import pools_quiet_for_fork


def start_workers(group: WorkerGroup, ctx: BaseContext, specs: list[WorkerSpec],
                  prime: Callable[[int], None]) -> None:
    """Start a worker per spec into ``group``; ``prime(worker_id)`` after each fork."""
    method = ctx.get_start_method()
    with pools_quiet_for_fork(method), gc_frozen_for_fork(method):
        if method == "fork" or len(specs) == 1:
            for spec in specs:
                group.workers.append(start_worker(ctx, spec))
                prime(spec.worker_id)  # NOTE [ Tasks before the next fork ]
            return
        _spawn_side_by_side(group, ctx, specs)


def _spawn_side_by_side(group: WorkerGroup, ctx: BaseContext, specs: list[WorkerSpec]) -> None:
    # spawn/forkserver: the spec is pickled once for all workers (NOTE [ Pickle once ]);
    # each child imports torch and unpickles, seconds each, so start them side by side
    # (a fork must not happen in a thread).
    once = PickledSpec(specs[0])
    try:
        with ThreadPoolExecutor(max_workers=min(len(specs), 8)) as pool:
            futures = [pool.submit(start_worker, ctx, spec, once) for spec in specs]
    finally:
        once.close()
    # Keep every worker that started (shutdown stops them), then report a failed start.
    group.workers.extend(f.result() for f in futures if f.exception() is None)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        raise failed[0]  # type: ignore[misc]


def forked_spec(group: WorkerGroup, spec: WorkerSpec) -> WorkerSpec:
    """A forked worker's spec: the slabs its predecessor left (the reader owns them from
    here, so a failed start gives them back to the bank), and ``forked``."""
    slabs = group.bank.withdraw(spec.worker_id) if group.bank is not None else []
    for sid, slab in enumerate(slabs):
        group.reader.adopt_banked(spec.worker_id, sid, slab)
    return dataclasses.replace(
        spec, slabs=tuple((s.address, s.nbytes) for s in slabs), forked=True
    )
