"""The one switch for what stoker does beyond torch's DataLoader.

NOTE [ Same as torch unless asked ]
A default does only what torch 2.13's DataLoader does in everything a user's code can observe,
for every dataset, sampler and collate that is correct under torch (the audit is the table in
docs/same_as_torch.md). Each behaviour below changes something a
program can observe, or holds only under an assumption about the user's code, so each is off
unless asked for, all together (``beyond_torch=True``, or ``STOKER_BEYOND_TORCH=1`` in the
environment) or by name (``beyond_torch={"per_batch_seeding", "move_stragglers"}``, or
``STOKER_BEYOND_TORCH=per_batch_seeding,move_stragglers``). ``stats()`` and the doctor name the
ones that would help a loader, with what each one promises.

What stays on is what no program can tell from torch: workers that start fast, raw RNG-state
copies, the loud failure reports, torch's own thread cap in workers, and OpenCV's pool kept
quiet while workers fork (an inherited pool can deadlock a forked worker: safety, not speed;
the worker gets the parent's thread count back). The process a worker runs in is torch's
(NOTE [ The worker's process is torch's ] in ``workers/entry.py``). Batches cross from the
workers as torch's do, by construction: torch's own collate in the worker, pickled with
torch's reductions (each storage in its own shared memory), so ``is_shared()``, strides,
storage offsets and aliasing are torch's; stoker's slabs are one of the behaviours below.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Literal

ENV = "STOKER_BEYOND_TORCH"

Behaviour = Literal[
    "per_batch_seeding", "inline_gathers", "batched_getitem", "deep_prefetch",
    "move_stragglers", "epoch_autopilot", "shared_lists", "slab_transport", "keep_slabs",
    "thread_caps", "gc_freeze", "cuda_forkserver", "profiler_ranges", "pickle_once",
]

# name -> what it does and what a program could tell (the promise it asks the user to make).
BEHAVIOURS: dict[str, str] = {
    "per_batch_seeding": (
        "reseed random, numpy and torch before every batch from (base seed, epoch, position): "
        "augmentations independent of num_workers, resume across num_workers; draws differ "
        "from torch's per-worker streams (same as seeding='per_batch')"),
    "inline_gathers": (
        "load a dataset whose batches are plain array gathers in the calling thread, without "
        "workers; worker_init_fn does not run and the live arrays are read"),
    "batched_getitem": (
        "fetch a whole batch with one gather compiled from __getitem__'s source instead of one "
        "__getitem__ call per sample"),
    "deep_prefetch": (
        "let each worker hold up to 8 small batches instead of prefetch_factor"),
    "move_stragglers": (
        "move batches queued behind a straggler to an idle worker: another worker than torch's "
        "loads them (get_worker_info().id differs)"),
    "epoch_autopilot": (
        "call set_epoch on a DistributedSampler the script never advances, so every epoch is "
        "shuffled anew"),
    "shared_lists": (
        "hand large lists of plain data to forked workers as read-only stand-ins (no copy-on-"
        "read); inside workers such a list is not type list"),
    "slab_transport": (
        "collate batches in workers straight into reused shared-memory slabs and send one "
        "descriptor per batch instead of torch's shared memory per tensor: is_shared() is "
        "False, a leaf that is a view of a larger tensor arrives compact (offset 0, its own "
        "storage), leaves that alias each other arrive as separate tensors; device= and "
        "keep_slabs use it"),
    "keep_slabs": (
        "keep a finished loader's shared-memory slabs for its next epoch instead of freeing "
        "them when the epoch ends"),
    "thread_caps": (
        "cap the BLAS and OpenMP pools in workers to one thread and set *_NUM_THREADS there "
        "(torch caps only its own pool), and OpenCV's to one thread with OpenCL off; a "
        "worker's os.environ, its BLAS threads and cv2.getNumThreads() differ"),
    "gc_freeze": (
        "freeze the main process's objects (gc.freeze) while workers are forked, so a worker's "
        "collections do not copy the parent's pages: in workers, objects made before iter() are "
        "never collected and gc.get_objects() leaves them out; in the main process they move "
        "to the oldest generation"),
    "cuda_forkserver": (
        "start workers with forkserver instead of fork once CUDA is initialised in the main "
        "process, so they may use CUDA: the dataset, collate_fn and worker_init_fn are pickled "
        "to each worker (CudaInWorkersError if they do not pickle), and the workers are "
        "ForkServerProcess-N"),
    "pickle_once": (
        "under spawn/forkserver, pickle the dataset, collate_fn and worker_init_fn once for "
        "all workers (protocol 5, large arrays out of band in one shared mapping each worker "
        "reads copy-on-write) and start the workers side by side, instead of once per worker "
        "in turn: their __getstate__/__reduce_ex__ run once, a worker's large arrays view "
        "the shared mapping (not owndata)"),
    "profiler_ranges": (
        "name the loader's stages in a torch.profiler trace (stoker: next(), receive batch "
        "from worker, pin batch, fetch, collate) inside torch's own enumerate(DataLoader) "
        "range: the trace lists ranges torch's does not"),
}
ALL: frozenset[str] = frozenset(BEHAVIOURS)


def _names(value: Iterable[Any], where: str) -> frozenset[str]:
    names = []
    for name in value:
        if not isinstance(name, str) or name not in BEHAVIOURS:
            raise ValueError(
                f"{where}: unknown behaviour {name!r}. Expected True, False, or names from "
                f"{sorted(BEHAVIOURS)}."
            )
        names.append(name)
    return frozenset(names)


def from_environment() -> frozenset[str]:
    """``STOKER_BEYOND_TORCH``: unset, ``0``, ``false`` or empty: none; ``1``, ``true`` or
    ``all``: all; else names separated by commas."""
    raw = os.environ.get(ENV, "").strip()
    if raw.lower() in ("", "0", "false", "no", "off"):
        return frozenset()
    if raw.lower() in ("1", "true", "yes", "on", "all"):
        return ALL
    return _names((part.strip() for part in raw.split(",") if part.strip()), f"{ENV}={raw!r}")


def resolve(value: Any) -> frozenset[str]:
    """The behaviours ``beyond_torch=value`` turns on (``None``: the environment's)."""
    if value is None:
        return from_environment()
    if value is True:
        return ALL
    if value is False:
        return frozenset()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(
            f"beyond_torch={value!r}: expected True (all of stoker's behaviours beyond torch), "
            f"False (torch's behaviour), or a set of names from {sorted(BEHAVIOURS)}."
        )
    return _names(value, f"beyond_torch={sorted(map(str, value))!r}")
