"""Accumulate ``LoaderStats`` as batches are delivered (main process, cheap per batch), read
the calling thread's CPU and queued time around sampled ``next()`` calls, and mark the
loader's waits and stages as named ranges in the user's ``torch.profiler`` trace.

stoker's ranges are beyond torch (``beyond_torch={"profiler_ranges"}``: a trace would list
ranges torch's does not; torch's own ``enumerate(DataLoader)#...`` range is always there,
NOTE [ The program's torch modes see torch's calls ]), and only while a profiler is recording:
``stage_range`` then opens a ``torch.autograd.profiler.record_function`` range; otherwise it
returns one shared ``nullcontext`` and costs a C call and a ``with`` per batch.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from stoker._core.stats import LoaderStats, StatsHook, TunerEvent, WorkerTimes
from stoker._core.torch_modes import profiling, subclass_unseen, unseen
from stoker.profile.events import EventRecorder

if TYPE_CHECKING:  # NOTE [ Import only what the loader needs ]: loads with the workers
    from stoker.workers.protocol import BatchReport


# -- the loader's stages in a torch.profiler trace ---------------------------------------------

_OFF = contextlib.nullcontext()


def stage_range(name: str, asked: bool) -> Any:
    """``with stage_range("stoker: ...", asked):`` a profiler range when the loader asked for
    stoker's ranges and a profiler records, else nothing."""
    if not asked or not profiling():
        return _OFF
    return torch.autograd.profiler.record_function(name)


WAIT = "stoker: next()"  # waiting for the batch; receiving and pinning it are nested
UNPACK = "stoker: receive batch from worker"
PIN = "stoker: pin batch"
FETCH = "stoker: fetch (dataset __getitem__)"
COLLATE = "stoker: collate"


# -- the calling thread's time in next() ----------------------------------------------------
# NOTE [ Where a thread's time goes ] (profile/timesplit.py): read here, on every batch's path;
# the splits and the report built from them are timesplit's.

# NOTE [ Sampled next() calls stay cheap ]
# A sampled call reads its thread's schedstat twice, each a /proc path walk (~10-30 us on a
# loaded VM through ``open()``; ``os.open``/``os.read`` skip the buffered file object). One
# every 5 ms cost ~1% of the main process's CPU on 1 ms batches (tiny, per_sample: 730 reads
# in 2,346 batches, ~10 us a batch); one every 20 ms gives a 1 s epoch ~50 samples, enough for
# the ``stats()`` splits, at ~0.1%. The fd is closed before the call returns: holding one
# across ``next()`` would change the fd numbers the user's code gets (num_workers=0 fetches
# inside it).
SAMPLE_EVERY_S = 0.02  # at most ~50 sampled next() calls a second


def read_schedstat(path: str = "/proc/thread-self/schedstat") -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but queued) of a thread; None where unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fields = os.read(fd, 256).split()
        finally:
            os.close(fd)
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def process_queued_s() -> float | None:
    """Seconds all live threads of this process have spent queued for a CPU."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    total = 0.0
    for tid in tasks:
        got = read_schedstat(f"/proc/self/task/{tid}/schedstat")
        if got is not None:
            total += got[1]
    return total


class CallingThreadClock:
    """The calling thread's CPU and queued time inside ``next()``, from sampled calls.

    Every ``stride``-th call is read, the stride set from the calls' past rate so that reads
    come about every ``SAMPLE_EVERY_S``. Chosen by count, not by "the first call after a
    pause": a pause is often the thread's own preemption, and the call right after it starts
    a fresh time slice, so sampling those would see too little queueing.

    NOTE [ The sampled queue has a floor ]
    A sampled call of ~0.1 ms rarely holds one of the thread's preemptions (one every few ms
    under load, each a wait of several ms), so on a short run (a 0.3 s epoch: ~15 samples) the
    sampled queue swings from none to most of the time: an in-memory dataset under a CPU hog
    was called input-bound, not contended, one run in three. The thread's whole queue over the
    run is known exactly (its schedstat at the first call and at the last sampled one), and at
    most the time spent outside ``next()`` in that span can have been queued there; the rest
    was queued inside. ``scaled`` raises the sampled queue to that floor. Where the loop body
    takes most of the time (a training step) the floor is 0 and sampling alone decides."""

    def __init__(self) -> None:
        self.sampled_s = 0.0
        self.sampled_cpu_s = 0.0
        self.sampled_queued_s = 0.0
        self.measured = True  # False once schedstat turned out unreadable
        self._calls = 0  # since the last sampled call
        self._stride = 1
        self._last_sample_at = 0.0
        self._start: tuple[float, float, float] | None = None  # wall, CPU, queued
        self.tid = 0
        self.total_at_start: tuple[float, float] | None = None
        self.process_queued_at_start: float | None = None
        # NOTE [ The sampled queue has a floor ]: when the span starts (its queue is
        # total_at_start's) and, at the last sampled call, its end (wall, queued, time in
        # next() so far).
        self._span_start_at = 0.0
        self._span_end: tuple[float, float, float] | None = None

    def enter(self, now: float) -> None:
        if not self.tid:  # the first call: where the thread-mode figures start
            self.tid = threading.get_native_id()
            # before the read: a queue at its return is in the span
            self._span_start_at = time.perf_counter()
            self.total_at_start = read_schedstat()
            self.process_queued_at_start = process_queued_s()
        self._start = None
        self._calls += 1
        if self.measured and self._calls >= self._stride:
            at = time.perf_counter()
            got = read_schedstat()
            if got is None:
                self.measured = False
            else:  # CPU from the thread clock: schedstat's lags by up to a scheduler tick
                self._start = (at, time.thread_time(), got[1])

    def leave(self, now: float, waited_s: float) -> None:
        """The call ends at ``now``; ``waited_s``: the time in ``next()`` so far, this call's
        included."""
        start, self._start = self._start, None
        if start is None:
            return
        # NOTE: a pending preemption often lands on the return from a read's system call; the
        # queue it causes is counted when the thread runs again. So the wall starts before the
        # first read (that queue is in both) and ends before the last (in neither).
        ended = time.perf_counter()
        cpu = time.thread_time()
        got = read_schedstat()
        if got is None:
            return
        self.sampled_s += ended - start[0]
        self.sampled_cpu_s += max(0.0, cpu - start[1])
        self.sampled_queued_s += max(0.0, got[1] - start[2])
        if threading.get_native_id() == self.tid:  # a call from another thread ends no span
            self._span_end = (ended, got[1], waited_s)
        if self._last_sample_at:
            period = (now - self._last_sample_at) / self._calls
            self._stride = max(1, min(10_000, round(SAMPLE_EVERY_S / max(period, 1e-7))))
        self._last_sample_at = now
        self._calls = 0

    def scaled(self, wait_s: float) -> tuple[float, float]:
        """(CPU, queued) seconds over all of ``wait_s``, from the sampled calls' shares."""
        if self.sampled_s <= 0:
            return 0.0, 0.0
        k = wait_s / self.sampled_s
        queued = min(wait_s, max(self.sampled_queued_s * k, self.queued_floor_s()))
        return min(wait_s - queued, self.sampled_cpu_s * k), queued

    def queued_floor_s(self) -> float:
        """Seconds the thread must have been queued inside ``next()``: its queue over the
        span from the first call to the last sampled one, less the span's time outside
        ``next()`` (NOTE [ The sampled queue has a floor ])."""
        if self.total_at_start is None or self._span_end is None:
            return 0.0
        t1, q1, waited = self._span_end
        outside = max(0.0, (t1 - self._span_start_at) - waited)
        return max(0.0, (q1 - self.total_at_start[1]) - outside)

    def other_threads_queued_s(self) -> float:
        """Queued time of this process's other live threads since the first ``next()``
        (``worker_type="thread"``: the fetch threads)."""
        now = process_queued_s()
        mine = read_schedstat(f"/proc/self/task/{self.tid}/schedstat") if self.tid else None
        if None in (now, self.process_queued_at_start, mine, self.total_at_start):
            return 0.0
        assert now is not None and self.process_queued_at_start is not None
        assert mine is not None and self.total_at_start is not None
        return max(0.0, (now - self.process_queued_at_start) - (mine[1] - self.total_at_start[1]))


class StatsAccumulator:
    """One per loader; iterators add to it. Worker figures arrive with each batch."""

    measures = True

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.beyond: frozenset[str] = frozenset()  # set by each iterator (its fetch spec's)
        self.batches = 0
        self.samples = 0
        self.skipped = 0
        self.empty_batches = 0
        self.wait_s = 0.0
        self.loop_s = 0.0
        self.fetch_wall_s = 0.0
        self.fetch_cpu_s = 0.0
        self.collate_s = 0.0
        self.pack_s = 0.0
        self.unpack_s = 0.0
        self.pin_s = 0.0
        # device= (NOTE [ Batches on the device ]): CPU time queuing copies, device time of
        # the copies and of the consumer's stream waiting for them, bytes and batches copied.
        self.to_device_s = 0.0
        self.device_transform_s = 0.0
        self.device_copy_s = 0.0
        self.device_wait_s = 0.0
        self.device_bytes = 0
        self.device_batches = 0
        self.fetch_queued_s = 0.0
        self.batched = 0
        self.gathered_in_main = 0
        self.inline = False
        self.threads = False
        self.tasks_moved = 0
        self.tasks_loaded_twice = 0
        self.concurrency: dict[int, int] = {}
        self.tuner: list[TunerEvent] = []
        self._left_next_at: float | None = None
        self._steal_at_start: tuple[int, int, int] | None = None
        # NOTE [ Where a thread's time goes ] (profile/timesplit.py)
        self.clock = CallingThreadClock()
        self.worker_times: dict[int, WorkerTimes] = {}
        # The per-batch timeline: None (the default) records nothing (profile/events.py).
        self.events: EventRecorder | None = None
        self.hooks: tuple[StatsHook, ...] = ()  # told of every batch handed out
        self.advice: list[str] = []  # LoaderStats.advice; one list for the loader's life

    def carry_over(self, old: StatsAccumulator) -> StatsAccumulator:
        """Take ``old``'s hooks, timeline and advice (a new accumulator for another worker
        count); the advice list itself, so what holds ``old.advise`` still adds to it."""
        self.hooks, self.events, self.advice = old.hooks, old.events, old.advice
        return self

    def advise(self, text: str) -> bool:
        """Keep ``text`` for ``LoaderStats.advice`` (once); whether it is new."""
        if text in self.advice:
            return False
        self.advice.append(text)
        return True

    def entered_next(self) -> float:
        if self._steal_at_start is None:
            self._steal_at_start = machine_ticks()
        now = time.perf_counter()
        if self._left_next_at is not None:
            self.loop_s += now - self._left_next_at
        self.clock.enter(now)
        return time.perf_counter()

    def left_next(self, entered_at: float, data: Any) -> None:
        now = time.perf_counter()
        self.wait_s += now - entered_at
        self.clock.leave(now, self.wait_s)
        samples = batch_samples(data)
        self._left_next_at = now
        self.batches += 1
        self.samples += samples
        if self.events is not None:
            self.events.step(entered_at, now, samples)
        for hook in self.hooks:
            hook.batch_delivered(samples, now, self.snapshot)

    def epoch_ended(self) -> None:
        self._left_next_at = None  # the gap between epochs is not the user's step

    def worker_batch(self, worker_id: int, report: BatchReport) -> None:
        # "" or which batched form: "source", "call" or "torch" (NOTE [ torch's own datasets ])
        self.batched += bool(report.batched)
        self.fetch_queued_s += report.queued_s
        wall, cpu, queued, other = self.worker_times.get(worker_id, WorkerTimes())
        self.worker_times[worker_id] = WorkerTimes(
            wall + report.fetch_wall_s, cpu + report.fetch_cpu_s, queued + report.queued_s,
            other + report.collate_s + report.pack_s)
        self.concurrency[worker_id] = report.concurrency
        self.fetch_wall_s += report.fetch_wall_s
        self.fetch_cpu_s += report.fetch_cpu_s
        self.collate_s += report.collate_s
        self.pack_s += report.pack_s
        if report.decisions:
            self.tuner.extend(
                TunerEvent(worker_id, e.at_s, e.concurrency, e.reason) for e in report.decisions
            )
        if self.events is not None:
            self.events.worker_batch(worker_id, report, time.perf_counter())

    def gathered_here(self) -> None:
        """A batch gathered in the main process (NOTE [ Gathers read the workers' starting
        copy ])."""
        self.batched += 1
        self.gathered_in_main += 1

    def unpacked(self, started: float) -> None:
        """The main process received a batch from a worker (started at ``started``)."""
        now = time.perf_counter()
        self.unpack_s += now - started
        if self.events is not None:
            self.events.main_stage("unpack", started, now)

    def pinned(self, started: float) -> None:
        now = time.perf_counter()
        self.pin_s += now - started
        if self.events is not None:
            self.events.main_stage("pin", started, now)

    def snapshot(self) -> LoaderStats:
        from stoker.profile.verdict import summarize

        main_cpu_s, main_queued_s = self.clock.scaled(self.wait_s)
        fetch_queued_s = self.fetch_queued_s
        if self.threads:  # the fetch threads live in this process: their queue, read now
            fetch_queued_s += self.clock.other_threads_queued_s()
        steal, idle = self._machine_shares()
        stats = LoaderStats(
            batches=self.batches, samples=self.samples, skipped=self.skipped,
            empty_batches=self.empty_batches,
            num_workers=self.num_workers, wait_s=self.wait_s, loop_s=self.loop_s,
            fetch_wall_s=self.fetch_wall_s, fetch_cpu_s=self.fetch_cpu_s,
            collate_s=self.collate_s, pack_s=self.pack_s, unpack_s=self.unpack_s,
            pin_s=self.pin_s, to_device_s=self.to_device_s,
            device_transform_s=self.device_transform_s, device_copy_s=self.device_copy_s,
            device_wait_s=self.device_wait_s, device_bytes=self.device_bytes,
            device_batches=self.device_batches, fetch_queued_s=fetch_queued_s,
            cpu_steal_share=steal, batched=self.batched, inline=self.inline,
            gathered_in_main=self.gathered_in_main,
            threads=self.threads, beyond_torch=tuple(sorted(self.beyond)),
            tasks_moved=self.tasks_moved, tasks_loaded_twice=self.tasks_loaded_twice,
            concurrency=tuple(self.concurrency[w] for w in sorted(self.concurrency)),
            tuner=tuple(self.tuner), main_cpu_s=main_cpu_s, main_queued_s=main_queued_s,
            worker_times=tuple(self.worker_times[w] for w in sorted(self.worker_times)),
            cpu_idle_share=idle,
            queue_measured=self.clock.measured and self.clock.sampled_s > 0,
            advice=tuple(self.advice),
        )
        return replace(stats, summary=summarize(stats))

    def _machine_shares(self) -> tuple[float, float | None]:
        """(steal share, idle share) of the machine's CPU time since the first next()."""
        start, now = self._steal_at_start, machine_ticks()
        if start is None or now is None or now[2] <= start[2]:
            return 0.0, None
        total = now[2] - start[2]
        return (now[0] - start[0]) / total, (now[1] - start[1]) / total


class NoStats(StatsAccumulator):
    """``collect_stats=False``: the main process measures nothing per batch (the workers
    still time their fetches: their concurrency tuner needs it)."""

    measures = False

    def entered_next(self) -> float:
        return 0.0

    def left_next(self, entered_at: float, data: Any) -> None:
        if self.hooks:  # a hook asked for the batches, though the loader measures nothing
            samples = batch_samples(data)
            self.batches += 1
            self.samples += samples
            for hook in self.hooks:
                hook.batch_delivered(samples, time.perf_counter(), self.snapshot)

    def worker_batch(self, worker_id: int, report: BatchReport) -> None:
        pass

    def gathered_here(self) -> None:
        pass

    def unpacked(self, started: float) -> None:
        pass

    def pinned(self, started: float) -> None:
        pass

    def snapshot(self) -> LoaderStats:
        from stoker.profile.verdict import with_advice

        advice = tuple(self.advice)
        return LoaderStats(num_workers=self.num_workers, advice=advice,
                           summary=with_advice("stoker: stats are off (collect_stats=False).",
                                               advice))


def machine_ticks() -> tuple[int, int, int] | None:
    """(steal, idle, total) CPU ticks of the whole machine so far (Linux ``/proc/stat``):
    steal is time the hypervisor ran other guests while this one's CPUs had work; idle
    counts iowait too (a CPU waiting on I/O is free to run anything)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], fields[3] + fields[4], sum(fields)) if len(fields) == 8 else None


def batch_samples(data: Any) -> int:
    """Samples in a delivered batch: the first dimension of its first tensor (depth first, in
    order), the length of its first list of plain values, else 1. Per batch, so it returns
    at the first leaf it can size instead of walking the batch. Not seen by the program's
    torch modes nor a tensor subclass's ``__torch_function__`` (NOTE [ The program's torch
    modes see torch's calls ]); a batch it cannot size counts as 1."""
    try:
        with unseen():
            n = _first_size(data)
    except Exception:  # a subclass's size that cannot be read: the statistics never raise
        n = None
    return 1 if n is None else n


def _first_size(item: Any) -> int | None:
    if isinstance(item, Tensor):
        if type(item) is not Tensor:  # a subclass's __torch_function__ does not see it either
            with subclass_unseen():
                return int(item.size(0)) if item.dim() else 1
        return int(item.size(0)) if item.dim() else 1  # size(0): nested tensors too
    if isinstance(item, dict):
        values: Any = item.values()
    elif isinstance(item, (list, tuple)) and item:
        if isinstance(item[0], (str, bytes, int, float)):
            return len(item)
        values = item
    else:
        return None
    for value in values:
        n = _first_size(value)
        if n is not None:
            return n
    return None
