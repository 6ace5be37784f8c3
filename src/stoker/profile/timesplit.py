"""Where a thread's wall time goes: on a CPU, runnable but queued for one, or blocked.

NOTE [ Where a thread's time goes ]
A fetch that takes longer than its CPU time was either *queued* (runnable, but every CPU was
busy: other processes, or more of our own threads than cores) or *blocked* (asleep in a system
call: storage, network, a sleep, a lock, a condition variable, the GIL). Only blocked time is
what more concurrent fetches can use; queued time is contention, and reading it as I/O is the
mistake the verdict must not make (a loaded machine made an in-memory dataset look like
"I/O or remote storage"). Linux keeps both numbers per thread in
``/proc/<pid>/task/<tid>/schedstat``: field 1 is the nanoseconds on a CPU, field 2 the
nanoseconds runnable on a run queue. So every split here is measured, not guessed:

    wall = CPU + queued + blocked      (blocked = the rest; steal counts as neither)

- the calling thread (the training loop) in ``next()``: read from its own schedstat around
  sampled ``next()`` calls (about one call every ``SAMPLE_EVERY_S``: NOTE [ Sampled next()
  calls stay cheap ]), scaled to all of ``wait_s`` (``CallingThreadClock`` in
  ``engine/stats.py``, on every batch's path), with the thread's whole queue less its time
  outside ``next()`` as a floor (NOTE [ The sampled queue has a floor ]); with
  ``num_workers=0`` this is where batches are loaded.
- each worker process: its fetches' wall and CPU time, its collate and pack time, and its
  main thread's queued time (``BatchReport``), per worker id; the queue is metered over all
  the worker does (waking up for a task too), so a worker's time is taken as CPU (fetch,
  collate, pack) + queued + blocked (what its fetches spent off a CPU beyond the queue).
- fetch threads of the training process (``worker_type="thread"``): the process's threads'
  queued time less the calling thread's, read when the stats are taken.

The GIL is not measured: CPython keeps no count of the time a thread waits for it. A thread
waiting for the GIL is blocked on a condition variable, so in a process with several fetch
threads part of "blocked" may be the GIL; the verdict infers it only from the process's own CPU
use (``profile/rules.py``) and says so. Without schedstat (not Linux) queued time cannot be
told from blocked time, ``queue_measured`` is False, and the verdict says the machine may be
too busy to tell rather than calling it I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoker._core.stats import LoaderStats


@dataclass(frozen=True)
class TimeSplit:
    """One thread's (or a group's summed) time, split: ``wall_s`` is the three parts' sum."""

    who: str
    cpu_s: float
    queued_s: float
    blocked_s: float
    queue_measured: bool = True

    @classmethod
    def of(cls, who: str, wall_s: float, cpu_s: float, queued_s: float, steal_share: float,
           measured: bool) -> TimeSplit:
        """From a wall time: blocked is what CPU, queue and steal leave of it."""
        blocked = max(0.0, wall_s * (1.0 - steal_share) - cpu_s - queued_s)
        return cls(who, cpu_s, queued_s, blocked, measured)

    @property
    def wall_s(self) -> float:
        return self.cpu_s + self.queued_s + self.blocked_s

    def share(self, part: float) -> float:
        return min(1.0, part / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        return self.share(self.cpu_s)

    @property
    def queued_share(self) -> float:
        return self.share(self.queued_s)

    @property
    def blocked_share(self) -> float:
        return self.share(self.blocked_s)


def worker_split(who: str, fetch_wall_s: float, fetch_cpu_s: float, queued_s: float,
                 collate_pack_s: float, s: LoaderStats) -> TimeSplit:
    """A worker's time on its batches: fetch CPU plus collate and pack (CPU work), the main
    thread's queued time (the worker meters it over all it does, waking up for a task too),
    and blocked: what the fetches spent off a CPU beyond that queue and steal."""
    blocked = max(0.0, fetch_wall_s * (1.0 - s.cpu_steal_share) - fetch_cpu_s - queued_s)
    return TimeSplit(who, fetch_cpu_s + collate_pack_s, queued_s, blocked, s.queue_measured)


def splits(s: LoaderStats) -> list[TimeSplit]:
    """The calling thread's ``next()`` and each worker's batches, for a report."""
    out = [TimeSplit.of("calling thread, in next()", s.wait_s, s.main_cpu_s, s.main_queued_s,
                        s.cpu_steal_share, s.queue_measured)]
    for wid, w in enumerate(s.worker_times):
        out.append(worker_split(f"worker {wid}", w.fetch_wall_s, w.fetch_cpu_s, w.queued_s,
                                w.collate_pack_s, s))
    if s.threads and s.fetch_wall_s > 0:
        out.append(TimeSplit.of("fetch threads", s.fetch_wall_s, s.fetch_cpu_s,
                                s.fetch_queued_s, s.cpu_steal_share, s.queue_measured))
    return out


def fetching(s: LoaderStats) -> TimeSplit:
    """The split of the threads that load batches: the calling thread when it loads them
    (``num_workers=0``, or gathers run inline), else the workers' batches (summed), or the
    fetch threads' fetches (``worker_type="thread"``: they collate in the calling thread)."""
    if loads_in_calling_thread(s):
        return TimeSplit.of("the training thread's next() calls", s.wait_s, s.main_cpu_s,
                            s.main_queued_s, s.cpu_steal_share, s.queue_measured)
    if s.threads:
        return TimeSplit.of("the fetch threads", s.fetch_wall_s, s.fetch_cpu_s,
                            s.fetch_queued_s, s.cpu_steal_share, s.queue_measured)
    return worker_split("the workers", s.fetch_wall_s, s.fetch_cpu_s, s.fetch_queued_s,
                        s.collate_s + s.pack_s, s)


def gathered_here(s: LoaderStats) -> bool:
    """Most batches were gathered in the training process from the copy the workers started
    with (NOTE [ Gathers read the workers' starting copy ]): its thread loads them."""
    return s.gathered_in_main * 2 > s.batches


def loads_in_calling_thread(s: LoaderStats) -> bool:
    """Batches were loaded in the training thread, and its ``next()`` calls were measured."""
    return (s.num_workers == 0 or s.inline or gathered_here(s)) and not s.threads and (
        s.main_cpu_s + s.main_queued_s > 0)
