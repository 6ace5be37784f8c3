"""Fetch the samples of several batches at once on a thread pool, completing batches in any order.

Used by a worker once the tuner raises its concurrency above one (NOTE [ Automatic
concurrency ]). Samples are started in task order, at most ``concurrency`` at a time, across
every batch the worker holds, so a slow sample delays only its own batch: the batches behind
it finish and are sent while it waits. All bookkeeping happens on the worker's main thread;
pool threads only run ``__getitem__`` and post ``(SAMPLE_DONE, job)`` to the worker's event
queue.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stoker.fetch.concurrency import ConcurrencyTuner, SampleClock
from stoker.fetch.fetchers import (
    MapFetcher,
    Skipped,
    error_text,
    forget_failed_index,
    note_failed_index,
    skippable,
)
from stoker.sampling import global_rngs
from stoker.sampling.sample_rng import clear_sample_context, set_sample_context

SAMPLE_DONE = "sample-done"
JOB_READY = "job-ready"


@dataclass
class Job:
    epoch: int
    task_id: int
    indices: list[Any]
    results: list[Any] = field(default_factory=list)
    errors: dict[int, BaseException] = field(default_factory=dict)
    remaining: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    whole: bool = False  # results[0] is the whole gathered batch (a __getitems__ dataset)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.indices)
        self.remaining = len(self.indices)


class SamplePipeline:
    def __init__(self, fetcher: MapFetcher, events: queue.SimpleQueue, base_seed: int) -> None:
        self._fetcher = fetcher
        self._events = events
        self._base_seed = base_seed
        self._pool: ThreadPoolExecutor | None = None
        self._waiting: deque[tuple[Job, int]] = deque()
        self._inflight = 0
        self.concurrency = 1
        # Sample completions after which a slot stayed idle for lack of samples, out of all:
        # a window mostly starved measures demand, not concurrency, so the tuner skips it.
        self.completions = 0
        self.starved = 0

    def set_fetcher(self, fetcher: MapFetcher) -> None:
        self._fetcher = fetcher

    def add(self, job: Job, start: int = 0) -> None:
        """Queue samples ``start:`` of ``job`` (the ones before were fetched already)."""
        self._waiting.extend((job, k) for k in range(start, len(job.indices)))
        self._feed()
        if job.remaining == 0:  # nothing was left to fetch
            self._events.put((JOB_READY, job))

    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._feed()

    def busy(self) -> bool:
        return bool(self._waiting) or self._inflight > 0

    def _feed(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="stoker-fetch")
        while self._inflight < self.concurrency and self._waiting:
            job, k = self._waiting.popleft()
            self._inflight += 1
            self._pool.submit(self._run, job, k)

    def _run(self, job: Job, k: int) -> None:  # on a pool thread
        index = job.indices[k]
        set_sample_context(self._base_seed, job.epoch, index)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            job.results[k] = self._fetcher.get_one_checked(index)
        except BaseException as exc:
            job.errors[k] = exc
        finally:
            clear_sample_context()
            job.wall_s += time.perf_counter() - t0
            job.cpu_s += time.thread_time() - c0
            self._events.put((SAMPLE_DONE, job))

    def sample_done(self, job: Job) -> bool:
        """Account one finished sample; True when its whole batch is done."""
        self._inflight -= 1
        job.remaining -= 1
        self._feed()
        self.completions += 1
        if self._inflight < self.concurrency:
            self.starved += 1
        return job.remaining == 0

    def take_starved_share(self) -> float:
        share = self.starved / self.completions if self.completions else 0.0
        self.completions = self.starved = 0
        return share

    def close(self, wait: bool = False) -> None:
        """Stop the fetch threads; ``wait`` joins them (quick when no fetch is running)."""
        self._waiting.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)


def settle(job: Job, skip_errors: bool) -> tuple[list[Any], list[Skipped], BaseException | None]:
    """The batch's kept samples, the skipped ones, or the error to report (lowest index first;
    its index noted for this thread, NOTE [ The sample that raised ] in ``fetch.fetchers``)."""
    if not job.errors:
        return job.results, [], None
    fatal = [k for k, e in job.errors.items() if not skippable(e)]
    if not skip_errors or fatal:
        first = min(fatal or job.errors)
        note_failed_index(job.errors[first], job.indices[first])
        return [], [], job.errors[first]
    kept = [r for k, r in enumerate(job.results) if k not in job.errors]
    skipped = [Skipped(job.indices[k], error_text(e)) for k, e in sorted(job.errors.items())]
    return kept, skipped, None


def explore(
    job: Job,
    fetcher: MapFetcher,
    tuner: ConcurrencyTuner,
    set_context: Callable[[Any], None],
    skip_errors: bool,
) -> int:
    """Fetch a job's samples alone, measuring for the tuner while it explores.

    Returns how many samples were fetched: all of them, or fewer once the tuner raised the
    concurrency (the caller hands the rest to a ``SamplePipeline``). Without ``skip_errors``
    the first error is raised, its index noted (NOTE [ The sample that raised ]).
    """
    forget_failed_index()
    at = [0]  # the position of the sample being loaded
    samples = _measured(job, fetcher, tuner, set_context, at)
    if not skip_errors:
        try:  # torch's fetcher makes the calls (NOTE [ torch's fetchers call the dataset ])
            fetched = fetcher.each(samples)
        except Exception as exc:
            note_failed_index(exc, job.indices[at[0]])
            raise
        job.results[:len(fetched)] = fetched
        return len(fetched)
    for index in samples:  # each alone: a sample that raises is left out, the rest go on
        k = at[0]
        try:
            job.results[k] = fetcher.get_one_checked(index)
        except Exception as exc:
            if not skippable(exc):
                note_failed_index(exc, index)
                raise
            job.errors[k] = exc
    return at[0] + 1 if job.remaining else len(job.indices)


def _measured(job: Job, fetcher: MapFetcher, tuner: ConcurrencyTuner,
              set_context: Callable[[Any], None], at: list[int]) -> Iterator[Any]:
    """The job's indices, one at a time; between handing one out and being asked for the
    next, its sample was loaded: measured for the tuner while it explores. Ends early once
    the tuner raised the concurrency (``at[0]``: the last sample's position)."""
    for k, index in enumerate(job.indices):
        at[0] = k
        exploring = tuner.exploring
        probe = global_rngs.snapshot(fetcher.fast_paths) if tuner.probing else None
        set_context(index)
        clock = SampleClock() if exploring else None
        t0, c0 = time.perf_counter(), time.thread_time()
        yield index
        job.wall_s += time.perf_counter() - t0
        job.cpu_s += time.thread_time() - c0
        job.remaining -= 1
        if clock is not None:
            wall, cpu, queued = clock.stop()
            touched = probe is not None and global_rngs.changed_since(probe)
            tuner.observe_sample(wall, cpu, touched, queued)
            if tuner.concurrency > 1:
                return
