"""One bounded run of a loader against a simulated training step, measured.

The rate counts only batches after a short warm-up (worker start, the concurrency tuner's
first probes), and the stats are the difference between the warm-up's end and the run's end,
so start-up costs do not pass for a bottleneck.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from stoker._core.stats import LoaderStats, WorkerTimes
from stoker.doctor.interrupts import NOTED
from stoker.doctor.machine import Load, between, mark
from stoker.profile.events import EventRecorder
from stoker.profile.verdict import summarize

if TYPE_CHECKING:
    from stoker.loader import DataLoader


@dataclass(frozen=True)
class Bounds:
    batches: int  # at most this many batches after the warm-up
    seconds: float  # and at most this long after the warm-up
    step_s: float = 0.0  # the simulated training step (sleeps: a GPU step leaves the CPU idle)
    warmup_batches: int = 2
    warmup_s: float = 0.3  # and at least this long


@dataclass(frozen=True)
class MemorySample:
    at: float  # perf_counter
    pid: int
    role: str  # "main" or "worker"
    pss_mib: float
    uss_mib: float


@dataclass
class Run:
    label: str
    overrides: dict[str, Any]
    samples_per_s: float = 0.0
    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    first_batch_s: float = 0.0
    stats: LoaderStats = field(default_factory=LoaderStats)
    load: Load = field(default_factory=lambda: Load(0.0, 0.0, False))
    events: EventRecorder | None = None
    memory: list[MemorySample] = field(default_factory=list)
    batch_times: list[tuple[float, int]] = field(default_factory=list)  # (left next(), samples)
    started: float = 0.0
    warm_at: float = 0.0  # perf_counter when the warm-up ended (the measured window starts)
    interrupted: bool = False
    error: str = ""
    plan: str = ""  # print(loader.plan()): how stoker runs the measured loader (NOTE [ One plan ])


Progress = Callable[[str, int, float], None]


def measure(build: Callable[[], DataLoader[Any]], run: Run, bounds: Bounds,
            detailed: bool = False, progress: Progress | None = None) -> Run:
    """Build the loader, iterate it within ``bounds``; fill ``run`` (also when interrupted:
    Ctrl-C ends the run early, ``run.interrupted`` says so, and the caller stops)."""
    gc.collect()
    before = mark()
    run.started = time.perf_counter()
    try:
        loader = build()
    except Exception as exc:  # a candidate the dataset refuses: reported, not fatal
        run.error = f"{type(exc).__name__}: {exc}"
        return run
    from stoker.loader import DataLoader

    # through the class: a subclass may use the name (NOTE [ A subclass's names ])
    run.plan = str(DataLoader.plan(loader)) if isinstance(loader, DataLoader) else ""
    if detailed:
        run.events = loader.record_timeline()
    watcher = _MemoryWatcher() if detailed else None
    try:
        with warnings.catch_warnings():
            # A candidate with more workers than cores is deliberate here.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            _iterate(loader, run, bounds, progress)
    except KeyboardInterrupt:
        run.interrupted = True
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        if watcher is not None:
            run.memory = watcher.stop()
    del loader
    gc.collect()
    run.load = between(before, mark(), time.perf_counter() - run.started)
    if NOTED.seen:  # a Ctrl-C a finalizer swallowed (doctor/interrupts.py)
        run.interrupted = True
    return run


def _iterate(loader: DataLoader[Any], run: Run, bounds: Bounds, progress: Progress | None
             ) -> None:
    it = iter(loader)
    warm_stats: LoaderStats | None = None
    warm_at = 0.0
    warm_samples = 0
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)  # another epoch: the bounds decide when to stop
                continue
            now = time.perf_counter()
            samples = _samples(batch)
            del batch
            run.batch_times.append((now, samples))
            if not run.first_batch_s:
                run.first_batch_s = now - run.started
            if warm_stats is None and len(run.batch_times) >= bounds.warmup_batches and (
                now - run.started >= bounds.warmup_s
            ):
                warm_stats, warm_at = loader.stats(), now
                run.warm_at = now
                warm_samples = sum(s for _, s in run.batch_times)
            elif warm_stats is not None:
                run.batches += 1
                run.samples += samples
                run.seconds = now - warm_at
                if progress is not None:
                    progress(run.label, run.batches, run.seconds)
                if run.batches >= bounds.batches or run.seconds >= bounds.seconds:
                    break
            if bounds.step_s:
                time.sleep(bounds.step_s)
    finally:
        shutdown = getattr(it, "_shutdown", None)
        if callable(shutdown):
            shutdown()
        if warm_stats is not None:
            run.stats = stats_between(warm_stats, loader.stats())
            run.samples_per_s = run.samples / run.seconds if run.seconds > 0 else 0.0
        elif run.batch_times:  # interrupted during the warm-up: the whole run, start-up and all
            run.stats = loader.stats()
            run.samples = sum(s for _, s in run.batch_times) - warm_samples
            run.seconds = run.batch_times[-1][0] - run.started
            run.samples_per_s = run.samples / run.seconds if run.seconds > 0 else 0.0


def stats_between(a: LoaderStats, b: LoaderStats) -> LoaderStats:
    """``b`` minus ``a`` for every summed figure; the latest state for the rest."""
    changes: dict[str, Any] = {}
    for f in fields(LoaderStats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("num_workers", "cpu_steal_share", "inline", "cpu_idle_share"):
            continue
        if isinstance(y, (int, float)) and not isinstance(y, bool):
            changes[f.name] = y - x
    workers = tuple(_minus(wb, a.worker_times[w]) if w < len(a.worker_times) else wb
                    for w, wb in enumerate(b.worker_times))
    diff = replace(b, **changes, tuner=b.tuner[len(a.tuner):], worker_times=workers)
    return replace(diff, summary=summarize(diff))


def _minus(b: WorkerTimes, a: WorkerTimes) -> WorkerTimes:
    return WorkerTimes(*(y - x for x, y in zip(a, b, strict=True)))


def _samples(batch: Any) -> int:
    from stoker.engine.stats import batch_samples

    return batch_samples(batch)


class _MemoryWatcher:
    """PSS / USS of the main process and its children, every ``interval_s`` (psutil, when
    installed; without it the picture leaves memory out and says why)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._loop, name="stoker-doctor-memory",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        me = psutil.Process()
        while not self._stop.wait(self._interval_s):
            procs = [(me, "main")] + [(c, "worker") for c in me.children(recursive=True)]
            now = time.perf_counter()
            for proc, role in procs:
                try:
                    info = proc.memory_full_info()
                except (psutil.Error, OSError):
                    continue
                self.samples.append(MemorySample(now, proc.pid, role, info.pss / 2**20,
                                                 info.uss / 2**20))

    def stop(self) -> list[MemorySample]:
        self._stop.set()
        self._thread.join(timeout=5.0)
        return self.samples
