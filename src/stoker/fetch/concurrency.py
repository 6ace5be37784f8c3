"""How many samples a worker fetches at once: one, as torch, unless the user promised more.

NOTE [ Automatic concurrency ]
torch's worker fetches one sample at a time, and so does stoker's unless the user promises that
``__getitem__`` may run on several threads at once: ``worker_concurrency=<int>`` (that many),
``stoker_thread_safe = True`` on the dataset class (then ``"auto"`` tunes the number), or
``worker_type="thread"``. Thread-safety cannot be detected by probing (a shared file handle read
with seek + read, an ``sqlite3`` connection, ``signal.alarm`` all work on one thread and break
on several), and neither can a draw from a global RNG that comes late in an epoch, so without
the promise nothing is guessed.

Either way a worker measures, over its first samples fetched one by one, the wall time of a
fetch, the CPU time its thread used (``time.thread_time``: Python and C code alike, GIL held or
not) and the time it sat runnable waiting for a CPU. A fetch that spends most of its wall time
not on a CPU is waiting (network, disk, sleeps). With the promise, the tuner then runs samples
on a thread pool, doubling the number in flight while throughput rises by at least 15%, and
settles on the best level when it stops rising; CPU-bound datasets stay at one. The level is
capped by ``_MAX_CONCURRENCY`` and by a memory budget (in-flight samples x their measured
size). Without the promise it stays at one and records what the promise would give (an
estimate from the wait/CPU ratio), which ``loader.stats()`` shows.

Under ``"auto"`` with the promise, a dataset seen drawing from ``random``, numpy's global RNG or
torch's default generator during those first samples still stays at one (its augmentations
would depend on thread timing); the promise itself says it draws only from
``stoker.sample_rng()``/``sample_generator()``, so later draws are the user's to avoid.
Every decision is recorded with its reason and shown by ``loader.stats()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from stoker._core.dataset_hooks import SupportsThreadSafe, declares


def _median(values: Any) -> float:
    """``statistics.median``, without importing it (and decimal, fractions) into a program
    that never did: a dataset can see ``sys.modules``."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("no median for empty data")
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


_MAX_CONCURRENCY = 64
_MEMORY_BUDGET_BYTES = 512 << 20
_WINDOW_S = 0.25
_WINDOW_BATCHES = 2
_WAIT_FRACTION = 0.5  # fetches waiting more than this share of their wall time are I/O-bound
_MOSTLY_WAITING = 0.85
_MIN_SAMPLE_S = 200e-6  # below this, thread hand-offs cost more than they save
_GAIN = 1.15
_PROBE_SAMPLES = 8  # judged by medians: a few samples stalled by a busy host do not decide


@dataclass(frozen=True)
class Decision:
    at_s: float  # seconds since the worker started
    concurrency: int
    reason: str


def _read_schedstat() -> float | None:
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class SampleClock:
    """Wall, CPU and run-queue time of one fetch on this thread.

    Time spent runnable but not running (the machine is busy) is neither CPU nor waiting for
    I/O: more threads would not help. Linux reports it per thread in /proc/thread-self/schedstat;
    without it, that time counts as waiting.
    """

    __slots__ = ("_wall", "_cpu", "_queued")

    def __init__(self) -> None:
        self._queued = _read_schedstat()
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()

    def stop(self) -> tuple[float, float, float]:
        """(wall, cpu, time waiting for a CPU) in seconds."""
        wall = time.perf_counter() - self._wall
        cpu = time.thread_time() - self._cpu
        queued_now = _read_schedstat() if self._queued is not None else None
        queued = queued_now - self._queued if queued_now is not None and self._queued else 0.0
        return wall, cpu, queued


class ConcurrencyTuner:
    """Per worker: explore sample by sample at one, then climb by windows of batches.

    ``settled`` and ``exploring`` are plain attributes that ``_decide`` keeps up to date, not
    properties: the worker's loop reads them for every batch and calls nothing of a settled
    tuner, whose ``observe`` would only count what nothing reads again (``_cap`` is reached
    only while climbing or exploring, and a tuner never unsettles).
    """

    def __init__(
        self, setting: int | str, thread_safe: bool, can_split: bool, threads_promised: bool
    ) -> None:
        """``thread_safe``: the dataset declares ``stoker_thread_safe`` (no RNG probe needed);
        ``threads_promised``: fetches may run on several threads (NOTE [ Automatic
        concurrency ]); without it ``"auto"`` stays at one and only measures."""
        self._start = time.perf_counter()
        self.decisions: list[Decision] = []
        self._thread_safe = thread_safe
        self._threads = threads_promised
        self.threads_promised = threads_promised  # read by the worker: fetch threads may come
        # Without the promise: what it would give, measured while exploring (an estimate).
        self.unused_gain: float | None = None
        fixed = setting if isinstance(setting, int) else None
        self.concurrency = fixed if fixed is not None else 1
        self.settled = fixed is not None or not can_split
        # Still at one sample at a time and undecided: fetch sample by sample and measure.
        self.exploring = not self.settled and self.concurrency == 1
        self._probes: list[tuple[float, float, float]] = []  # (wall, cpu, queued) per sample
        self._best = (1, 0.0)
        self._reset_window()
        if fixed is not None:
            self._decide(fixed, "set by worker_concurrency", settle=True)
        elif not can_split:
            self._decide(1, "batches are fetched whole (an iterable or __getitems__ dataset)",
                         settle=True)

    def _reset_window(self) -> None:
        self._w_start = time.perf_counter()
        self._w_batches = 0
        self._w_samples = 0
        self._w_bytes = 0

    def _decide(self, concurrency: int, reason: str, settle: bool = False) -> None:
        self.settled = self.settled or settle
        self.concurrency = concurrency
        self.exploring = not self.settled and concurrency == 1
        self.decisions.append(Decision(time.perf_counter() - self._start, concurrency, reason))

    @property
    def probing(self) -> bool:
        """Whether the next sample should be checked for global-RNG use."""
        return self.exploring and self._threads and not self._thread_safe

    def observe_sample(
        self, wall_s: float, cpu_s: float, touched_rng: bool, queued_s: float = 0.0
    ) -> None:
        """One sample fetched alone (while exploring); ``queued_s``: waiting for a CPU."""
        if not self.exploring:
            return
        if touched_rng:
            self._decide(
                1,
                "__getitem__ draws from a global RNG (random/numpy/torch); concurrent fetches "
                "would make augmentations depend on thread timing. Declare "
                "stoker_thread_safe = True on the dataset (drawing from stoker.sample_rng()) "
                "to allow them",
                settle=True,
            )
            return
        self._probes.append((wall_s, cpu_s, queued_s))
        if len(self._probes) < _PROBE_SAMPLES:
            return
        # Medians, not sums: on a shared or virtual machine a sample now and then loses
        # milliseconds to another tenant (steal time looks like waiting from inside), and one
        # such sample must not turn a CPU-bound dataset into a "waiting" one.
        per_sample = _median(w for w, _, _ in self._probes)
        wait = _median(
            max(0.0, 1.0 - (c + q) / w) if w > 0 else 0.0 for w, c, q in self._probes
        )
        cpu = _median(c for _, c, _ in self._probes)
        if wait < _WAIT_FRACTION or per_sample < _MIN_SAMPLE_S:
            self._decide(1, f"fetches keep a CPU busy (wait {wait:.0%}, "
                            f"{per_sample * 1e6:.0f} us per sample)", settle=True)
            return
        # A fetch taking w wall seconds per c CPU seconds can overlap about w/c times before
        # the CPU is the limit: start there (within the caps); the climb checks it pays.
        # Fetches that almost only wait start at the cap: an epoch is often too short to climb.
        overlap = per_sample / max(cpu, 1e-9)
        if not self._threads:
            self.unused_gain = min(float(_MAX_CONCURRENCY), per_sample / max(
                _median(c + q for _, c, q in self._probes), 1e-9))
            self._decide(1, f"fetches wait {wait:.0%} of their time ({per_sample * 1e3:.1f} ms "
                            "each), one at a time as in torch: " + opt_in_hint(self.unused_gain),
                         settle=True)
            return
        start = self._cap() if wait >= _MOSTLY_WAITING else max(2, min(self._cap(), int(overlap)))
        self._best = (1, 1.0 / per_sample)
        self._decide(start,
                     f"fetches wait {wait:.0%} of their time ({per_sample * 1e3:.1f} ms each)")
        self._reset_window()

    def observe(self, samples: int, nbytes: int, starved: bool = False) -> None:
        """One finished batch (while climbing); ``starved``: slots stood idle for lack of work."""
        if starved and not self.settled and self.concurrency > 1:
            self._reset_window()  # demand-limited: says nothing about this level
            return
        self._w_batches += 1
        self._w_samples += samples
        self._w_bytes += nbytes
        elapsed = time.perf_counter() - self._w_start
        if self.settled or self.concurrency == 1:
            return
        if elapsed < _WINDOW_S or self._w_batches < _WINDOW_BATCHES:
            return
        self._climb(self._w_samples / elapsed)
        self._reset_window()

    def _cap(self) -> int:
        per_sample = self._w_bytes / self._w_samples if self._w_samples else 0
        by_memory = int(_MEMORY_BUDGET_BYTES // per_sample) if per_sample else _MAX_CONCURRENCY
        return max(1, min(_MAX_CONCURRENCY, by_memory))

    def _climb(self, rate: float) -> None:
        c = self.concurrency
        best_c, best_rate = self._best
        if rate >= best_rate * _GAIN and c < self._cap():
            self._best = (c, rate)
            self._decide(min(2 * c, self._cap()), f"{rate:.0f} samples/s at {c}: still rising")
            return
        if rate >= best_rate:
            self._best = (c, rate)
        final = self._best[0]
        self._decide(final, f"{rate:.0f} samples/s at {c} vs {best_rate:.0f} at {best_c}: "
                            f"settled at {final}", settle=True)


def declared_thread_safe(dataset: Any) -> bool:
    return declares(dataset, SupportsThreadSafe)


def opt_in_hint(gain: float) -> str:
    """What promising thread-safety would give, from a measured wait/CPU ratio (an estimate)."""
    level = max(2, min(_MAX_CONCURRENCY, round(gain)))
    speedup = min(gain, level)
    return (f"if __getitem__ is thread-safe (and draws randomness only from "
            f"stoker.sample_rng()), worker_concurrency={level} would fetch ~{speedup:.0f}x "
            "faster per worker (estimate from the fetches' wait/CPU time); "
            "stoker_thread_safe = True on the dataset class lets stoker tune it")
