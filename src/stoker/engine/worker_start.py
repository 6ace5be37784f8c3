"""Start an iterator's worker processes: forked one after another, or spawned side by side.

NOTE [ Tasks before the next fork ]
Forking a worker costs the main process ~6 ms (its page tables), and workers are forked
one after another. Sending tasks only once all were forked left the first worker idle
for the forks after it, at the start of every epoch. So each worker of a map-style
dataset gets its first task as soon as it is forked (``prime``) if the round-robin cycle is at
it and drawing it from the sampler changes nothing a later worker could read (torch forks
every worker before its first draw: ``fast_batches.draws_unseen_by_workers``, torch's own
samplers without a generator of the program's), and only where workers are forked: a
spawned or forkserver worker is pickled in the main process, running the program's
``__getstate__``/``__reduce__``, which may draw from the global RNG the sampler's first task
draws its seed from (torch pickles every worker before that draw). The rest follow after the
last start, in the same order as before, so which worker loads
which batch does not change: at an epoch's start task k goes to worker k mod n, and a resumed
epoch starts the cycle where the saved run stopped (``TaskBook.start_turn_at``: position p to
worker p mod n, the first at ``batches`` mod n; NOTE [ Worker streams resume ]), so a worker
forked before the one whose turn it is gets its first task after the last fork. An
IterableDataset's tasks follow torch's round-robin cycle, which is only walked after every
fork.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import BaseContext
from typing import Any

from torch.utils.data._utils.signal_handling import _set_SIGCHLD_handler

from stoker._core.plan import Plan
from stoker._core.specs import WorkerSpec
from stoker._core.torch_voice import PICKLE_ERROR_AT_START, warn_as_torch
from stoker.engine.loader_state import EngineState
from stoker.engine.worker_group import WorkerGroup
from stoker.fastpaths.batched_getitem import compile_batched
from stoker.fetch.fetchers import source_form
from stoker.sampling.datapipes import distributed_settings, is_datapipe
from stoker.workers import diagnostics, pickle_culprit
from stoker.workers.launch import gc_frozen_for_fork, launch, make_worker, start_worker
from stoker.workers.spec_once import PickledSpec
from stoker.workers.thread_caps import pools_quiet_for_fork

# torch's text, given where torch's worker start fails to pickle (its start catches the same)
_PICKLE_ERROR_AT_START = (
    "Got pickle error when attempting to start a worker Process. "
    "This might be because the worker Process arguments are not picklable. "
    "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
    "to 'forkserver', which requires the worker Process arguments to be picklable. "
    "You can also try multiprocessing.set_start_method('fork')."
)


def worker_specs(
    plan: Plan, ctx: BaseContext, group: WorkerGroup, engine: EngineState, *, base_seed: int,
    first_epoch: int, datapipe_seed: int | None, vector_trusted: bool, resume: tuple[Any, ...],
) -> list[WorkerSpec]:
    """One ``WorkerSpec`` per worker of ``plan``'s pass. Under fork, large plain lists go to the
    workers as shared containers (NOTE [ Automatic list sharing ]), and each worker takes the
    slabs its predecessor left (NOTE [ Slabs outlive workers ]); spawned workers get the
    pickled dataset anyway."""
    fetch, dataset = plan.fetch, plan.dataset
    fork = ctx.get_start_method() == "fork"
    shared = engine.list_sharing.plan(
        dataset, asked="shared_lists" in fetch.beyond) if fork else ()
    if fork and source_form(fetch):
        compile_batched(dataset)  # cached: forked workers inherit it
    specs = [
        WorkerSpec(
            worker_id=wid,
            num_workers=plan.num_workers,
            fetch=fetch,
            base_seed=base_seed,
            worker_init_fn=plan.worker_init_fn,
            # idle slabs kept: memory vs allocations (an int with workers: torch's default 2)
            max_idle_slabs=plan.prefetch_factor + 2,  # type: ignore[operator]
            parent_pid=os.getpid(),
            first_epoch=first_epoch,
            seed_per_batch=plan.seeding == "per_batch",
            dist=plan.dist,
            concurrency=plan.worker_concurrency,
            shared_lists=shared,
            vector_trusted=vector_trusted,
            datapipe_seed=datapipe_seed,
            datapipe_ranks=distributed_settings() if is_datapipe(dataset) else None,
            persistent=plan.persistent_workers,
            resume=resume,
            stack_signal=diagnostics.signal_wanted(),
        )
        for wid in range(plan.num_workers)
    ]
    if fork:  # NOTE [ Slabs outlive workers ]; keep_slabs: NOTE [ Same as torch unless asked ]
        if "keep_slabs" in fetch.beyond:  # else freed as torch frees them
            group.bank = engine.slab_bank
        specs = [forked_spec(group, s) for s in specs]
    return specs


def start_workers(group: WorkerGroup, ctx: BaseContext, specs: list[WorkerSpec],
                  prime: Callable[[int], None]) -> None:
    """Start a worker per spec into ``group``; ``prime(worker_id)`` after each fork. Then, as
    torch's iterator does once its workers run, torch's SIGCHLD handler is set in the main
    process (NOTE [ The worker's process is torch's ])."""
    method = ctx.get_start_method()
    beyond = specs[0].fetch.beyond if specs else frozenset()
    failed: BaseException | None = None  # the sampler's, while priming
    try:
        with pools_quiet_for_fork(method), gc_frozen_for_fork(method, "gc_freeze" in beyond):
            # torch starts its workers one after another, each pickling its own arguments
            # in this thread; pickling once for all of them is beyond torch (NOTE [ Pickle
            # once ]: __getstate__ runs once, arrays view a shared mapping)
            if method == "fork" or len(specs) == 1 or "pickle_once" not in beyond:
                for spec in specs:
                    group.workers.append(start_worker(ctx, spec))
                    if failed is None and method == "fork":  # spawn pickles the next one
                        try:
                            prime(spec.worker_id)  # NOTE [ Tasks before the next fork ]
                        except BaseException as exc:
                            failed = exc
            else:
                _spawn_side_by_side(group, ctx, specs)
    except pickle_culprit.PICKLE_ERRORS as exc:
        warn_as_torch(_PICKLE_ERROR_AT_START, PICKLE_ERROR_AT_START)  # torch's, as it re-raises
        if method != "fork" and specs:  # NOTE [ What spawn cannot send ]
            pickle_culprit.explain(exc, specs[0], method)
        raise
    # torch starts every worker and sets its handler before its first prefetch draws from
    # the sampler: a sampler that raises there leaves the same process behind.
    _set_SIGCHLD_handler()
    if failed is not None:
        try:
            raise failed
        finally:  # no cycle through this frame (the iterator goes with the traceback)
            del failed


def _spawn_side_by_side(group: WorkerGroup, ctx: BaseContext, specs: list[WorkerSpec]) -> None:
    # spawn/forkserver: the spec is pickled once for all workers (NOTE [ Pickle once ]);
    # each child imports torch and unpickles, seconds each, so start them side by side
    # (a fork must not happen in a thread). The process objects are made here, in order,
    # so they are named as torch's (NOTE [ The worker's process is torch's ]).
    once = PickledSpec(specs[0])
    try:
        made = [make_worker(ctx, spec, once) for spec in specs]
        # named: an unnamed executor takes a number from the ones a program's own get
        with ThreadPoolExecutor(max_workers=min(len(specs), 8),
                                thread_name_prefix="stoker-start") as pool:
            futures = [pool.submit(launch, new) for new in made]
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
