"""Frozen specs handed from the loader to executors (one object instead of many arguments)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

DatasetKind = Literal["map", "iterable"]


@dataclass(frozen=True)
class FetchSpec:
    """What a fetcher needs to turn an index (or batch of indices) into a collated batch."""

    dataset: Any
    kind: DatasetKind
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    skip_errors: bool = False  # on_error="skip": leave out samples whose fetch raises
    fast_paths: bool = True  # NOTE [ One switch for the fast paths ] in stoker.fastpaths.switch
    # what the loader does beyond torch: NOTE [ Same as torch unless asked ]
    beyond: frozenset[str] = frozenset()


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs; built once per worker start."""

    worker_id: int
    num_workers: int
    fetch: FetchSpec
    base_seed: int
    worker_init_fn: Callable[[int], None] | None
    max_idle_slabs: int
    parent_pid: int
    first_epoch: int  # the iterator's epoch counter when the worker starts
    seed_per_batch: bool  # reseed the global RNGs from (base seed, epoch, position) per batch
    dist: Any = None  # the main process's stoker.distributed.DistContext
    concurrency: int | str = "auto"  # samples fetched at once: an int, or "auto" (tuned)
    # (owner, attribute, shared container): NOTE [ Automatic list sharing ]; fork only
    shared_lists: tuple = ()
    # (address, nbytes) of inherited slabs: NOTE [ Slabs outlive workers ]; fork only
    slabs: tuple[tuple[int, int], ...] = ()
    # the batched form read from __getitem__'s source passed its probes in an earlier epoch
    vector_trusted: bool = False
    forked: bool = False  # started by fork inside pools_quiet_for_fork
    # a DataPipe graph: its shufflers' seed, and (world size, rank) to shard it by
    datapipe_seed: int | None = None
    datapipe_ranks: tuple[int, int] | None = None
    # NOTE [ Worker streams resume ] (stoker.engine.worker_streams): persistent workers answer
    # each Reset with their states; ``resume`` holds, per worker id, (encoded RNG states or
    # None, (dataset state,) or None) to restore after worker_init_fn, or is empty.
    persistent: bool = False
    resume: tuple[tuple[Any, Any], ...] = ()
    # register the stack signal: only while the doctor samples (NOTE [ The stack signal ])
    stack_signal: bool = False

