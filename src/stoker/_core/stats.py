"""Per-stage measurements of a loader, as plain frozen records (``loader.stats()``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import NamedTuple, Protocol, runtime_checkable


@dataclass(frozen=True)
class TunerEvent:
    """One decision of a worker's concurrency tuner (NOTE [ Automatic concurrency ])."""

    worker_id: int
    at_s: float  # seconds since that worker started
    concurrency: int
    reason: str


class WorkerTimes(NamedTuple):
    """One worker's time on its batches, summed, in seconds (``LoaderStats.worker_times``).

    A tuple, so ``wall, cpu, queued, other = times`` reads it as before. ``queued_s`` is not a
    part of ``fetch_wall_s``: it is metered over all the worker does (fetching, collating,
    packing, waking up for its next task), so on a busy machine it can exceed the fetch wall
    time (NOTE [ Where a thread's time goes ] in ``profile/timesplit.py``).
    """

    fetch_wall_s: float = 0.0  # wall time of its fetches (``__getitem__``, ``__getitems__``)
    fetch_cpu_s: float = 0.0  # CPU time of those fetches
    queued_s: float = 0.0  # runnable but waiting for a CPU, over all the worker did
    collate_pack_s: float = 0.0  # collating its batches and packing them for the main process


@dataclass(frozen=True)
class LoaderStats:
    """Where the time went, summed over the epochs since the loader was created.

    Times are seconds. ``wait_s`` is the time the training loop spent blocked in ``next()``;
    ``loop_s`` the time between ``next()`` calls (the user's step). The fetch, collate and
    pack figures are summed over all workers (CPU-seconds of work, not wall time), and
    ``worker_times`` holds each worker's part of them (a ``WorkerTimes`` per worker, in
    worker-id order: the parts add up to ``fetch_wall_s``, ``fetch_cpu_s``,
    ``fetch_queued_s`` and ``collate_s + pack_s``).

    ``fetch_queued_s`` is the time the loading threads were runnable but waiting for a CPU
    over all they did: fetching, and also collating, packing and waking up for their next
    task. It is not a part of ``fetch_wall_s`` and can exceed it (a machine whose CPUs are
    busy queues a worker each time a task wakes it); compare it with the wall time of all
    their work, as the doctor's "Per thread" lines do.
    """

    batches: int = 0
    samples: int = 0
    skipped: int = 0
    # on_error="skip": steps whose every sample was skipped, not yielded (the epoch is shorter)
    empty_batches: int = 0
    num_workers: int = 0
    wait_s: float = 0.0
    loop_s: float = 0.0
    fetch_wall_s: float = 0.0
    fetch_cpu_s: float = 0.0
    collate_s: float = 0.0
    pack_s: float = 0.0
    unpack_s: float = 0.0
    pin_s: float = 0.0
    # device= (NOTE [ Batches on the device ]): ``to_device_s`` is the part of ``wait_s`` spent
    # queuing copies and the device_transform (the rest of ``wait_s`` is waiting for workers);
    # ``device_copy_s`` the device time of the copies (and transform) on the copy stream;
    # ``device_wait_s`` the device time the training stream waited for a copy (CUDA events,
    # not part of ``wait_s``); ``device_bytes`` / ``device_batches`` what was copied;
    # ``device_transform_s`` the part of ``to_device_s`` spent in the device_transform (queuing
    # its kernels, and its own CPU work: DecodeImages decodes there).
    to_device_s: float = 0.0
    device_transform_s: float = 0.0
    device_copy_s: float = 0.0
    device_wait_s: float = 0.0
    device_bytes: int = 0
    device_batches: int = 0
    # Loading threads' time runnable but waiting for a CPU (more threads than cores, other
    # processes), over all they did (fetch, collate, pack, waking up: not a part of
    # fetch_wall_s, see above), and the share of the machine's CPU time a hypervisor gave to
    # other guests (steal) meanwhile: neither is I/O, though both make fetches take longer
    # than their CPU time.
    fetch_queued_s: float = 0.0
    cpu_steal_share: float = 0.0
    # NOTE [ Where a thread's time goes ] (profile/timesplit.py): the calling thread's time in
    # ``next()`` on a CPU and runnable-but-queued (the rest of ``wait_s`` it was blocked:
    # waiting for a worker, storage, a lock), estimated from sampled calls; per worker, its
    # ``WorkerTimes`` (fetch wall, fetch CPU, queued, collate + pack) in worker-id order; the share
    # of the machine's CPU time that was idle meanwhile (None: unknown); whether queued time
    # could be read at all (Linux).
    main_cpu_s: float = 0.0
    main_queued_s: float = 0.0
    worker_times: tuple[WorkerTimes, ...] = ()
    cpu_idle_share: float | None = None
    queue_measured: bool = False
    # batches fetched whole, not sample by sample (NOTE [ Vectorised fetch ], NOTE [ torch's
    # own datasets ])
    batched: int = 0
    # of those, batches of torch's classes gathered in the main process from the copy the
    # workers started with (NOTE [ Gathers read the workers' starting copy ])
    gathered_in_main: int = 0
    # num_workers > 0, yet loaded in the calling thread (NOTE [ Gathers need no workers ])
    inline: bool = False
    # worker_type="thread": fetches ran on threads of the training process, not in workers
    threads: bool = False
    # Batches a worker left without tasks took from another's queue (NOTE [ Idle workers take
    # queued tasks ]), and how many of those the first worker had already started (loaded twice).
    tasks_moved: int = 0
    tasks_loaded_twice: int = 0
    concurrency: tuple[int, ...] = ()
    tuner: tuple[TunerEvent, ...] = field(default_factory=tuple)
    # what the loader did beyond torch (NOTE [ Same as torch unless asked ]), with what it
    # implies (device= and keep_slabs use slab_transport)
    beyond_torch: tuple[str, ...] = ()
    # What stoker advises about this loader that torch does not say (a generator every worker
    # copies, worker memory growing by copy-on-read), each text once, in the order given; the
    # same texts end ``summary`` (one a line) and go to the ``stoker.*`` loggers at DEBUG,
    # never through ``warnings`` nor on stderr (NOTE [ torch's voice ] and NOTE [ Advice is
    # quiet ] in ``_core/torch_voice.py``).
    advice: tuple[str, ...] = ()
    summary: str = ""

    def __str__(self) -> str:
        return self.summary

    def as_dict(self) -> dict[str, float]:
        """The figures as one flat dict of numbers, for any logger.

        Every field that is a number (bools as 0/1), plus ``samples_per_s`` (samples over
        wait + loop time), ``wait_share`` (the share of that time ``next()`` blocked: above
        ~0.1 the loop is input-bound) and ``concurrency_max``; the verdict text and the
        tuner's decisions and the advice are left out. For example::

            stats = loader.stats().as_dict()
            writer.add_scalars("loader", stats, step)                    # TensorBoard
            self.log_dict({f"loader/{k}": v for k, v in stats.items()})  # Lightning
        """
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (bool, int, float)):
                out[f.name] = float(value) if isinstance(value, bool) else value
        total = self.wait_s + self.loop_s
        out["samples_per_s"] = self.samples / total if total > 0 else 0.0
        out["wait_share"] = self.wait_s / total if total > 0 else 0.0
        out["concurrency_max"] = max(self.concurrency, default=0)
        return out


@runtime_checkable
class StatsHook(Protocol):
    """Told of every batch a loader hands out (``loader.add_stats_hook``), in the calling
    thread, right after the batch's figures are counted: ``samples`` in it, ``at`` its
    ``time.perf_counter()``, and ``stats()`` the loader's figures so far (a ``LoaderStats``;
    it costs a snapshot, so call it only when needed). ``stoker doctor`` measures a script's
    loader through one. A hook that raises stops the loop with its exception."""

    def batch_delivered(self, samples: int, at: float, stats: Callable[[], LoaderStats]
                        ) -> None:
        """A batch of ``samples`` was handed out at ``at``; ``stats()`` gives the figures."""


# Told of every stoker loader built in this process, at the end of its ``__init__``: how code
# above the loader attaches to it (``stoker doctor``'s agent, registered as the script the doctor
# runs starts: NOTE [ The doctor attaches from above ] in ``doctor/agent.py``).
_ON_BUILT: list[Callable[..., None]] = []


def on_every_loader(hook: Callable[..., None]) -> None:
    """Call ``hook(loader)`` for every stoker ``DataLoader`` built from now on."""
    _ON_BUILT.append(hook)


def loader_built(built: object) -> None:
    """Tell the hooks of ``on_every_loader`` of a loader just built."""
    for hook in tuple(_ON_BUILT):
        hook(built)
