"""`stoker demo` and the pieces `benchmarks/` reuse: a process-tree memory sampler, an epoch
timer and the demo's run. Its tiers (torch, the drop-in, the image path, a pack) and their
table are in ``cli/demo_tiers.py``; its workload (synthetic JPEGs, their datasets and
augmentation) in ``doctor/demo_workload.py`` (the doctor's demo target runs it too), exported
here.

Needs the `demo` extra (Pillow and psutil): ``pip install 'stoker[demo]'``.

Everything here takes the loader class as a parameter, so the same code measures
``torch.utils.data.DataLoader`` and ``stoker.DataLoader`` on the same `Dataset` object.
"""

from __future__ import annotations

import importlib
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from stoker.cli.demo_tiers import (
    Tier,
    build_tiers,
    decoder_line,
    format_tiers,
    link_folder,
    pack_files,
    run_by_run,
    torchvision_modules,
    verdict,
)
from stoker.doctor.demo_workload import (
    CROP_SIZE,
    JpegDataset,
    decode_and_augment,
    make_jpeg_files,
    random_resized_crop_box,
)

__all__ = [
    "BASELINE",
    "CANDIDATE",
    "CROP_SIZE",
    "DemoOptions",
    "DemoResult",
    "EpochTiming",
    "JpegDataset",
    "ProgressBar",
    "TreeMemorySampler",
    "batch_size_of",
    "decode_and_augment",
    "load_class",
    "loader_label",
    "make_jpeg_files",
    "random_resized_crop_box",
    "run_demo",
    "time_epoch",
    "tree_pss_bytes",
]

BASELINE = "torch.utils.data:DataLoader"
CANDIDATE = "stoker:DataLoader"


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------


def tree_pss_bytes(pid: int | None = None, exclude: Collection[int] = ()) -> int:
    """PSS of a process and all its descendants but ``exclude`` (e.g. a server the caller
    started), in bytes (shared pages counted once)."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        if proc.pid in exclude:
            continue
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # exited between listing and reading: holds no memory any more
    return total


class TreeMemorySampler:
    """Samples `tree_pss_bytes()` of this process every `interval_s` on a daemon thread and
    keeps the peak. Use as a context manager; `reset()` starts a new peak. Reading a
    process's PSS costs ~3 ms of CPU: a sampler every 50 ms over 4 processes takes a quarter
    of a core, so time epochs without one."""

    def __init__(self, interval_s: float = 0.1, exclude: Collection[int] = ()) -> None:
        self.interval_s = interval_s
        self.exclude = frozenset(exclude)
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> TreeMemorySampler:
        self.reset()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stoker-pss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> int:
        """Take one reading now (also done by the thread) and return it."""
        value = tree_pss_bytes(exclude=self.exclude)
        with self._lock:
            self._peak = max(self._peak, value)
        return value

    def reset(self) -> None:
        with self._lock:
            self._peak = 0
        self.sample()

    @property
    def peak_mib(self) -> float:
        with self._lock:
            return self._peak / 2**20


@dataclass(frozen=True)
class EpochTiming:
    """One pass over a loader: seconds to the first batch, seconds for the pass, counts."""

    time_to_first_batch_s: float
    epoch_s: float
    batches: int
    samples: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.epoch_s if self.epoch_s > 0 else 0.0


def batch_size_of(batch: Any) -> int:
    """Number of samples in a collated batch: the leading size of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        nested = isinstance(first, (torch.Tensor, dict, list, tuple))
        return batch_size_of(first) if nested else len(batch)
    return 1


def time_epoch(
    loader: Iterable[Any],
    *,
    started: float | None = None,
    max_batches: int | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> EpochTiming:
    """Iterate `loader` once (or `max_batches` batches) and time it.

    The clock starts at `started` (a `time.perf_counter()` value: pass the time before the
    loader was built to count construction) or else just before ``iter(loader)``.
    `on_batch(batches, samples)` is called after each batch (for a progress bar).
    """
    start = time.perf_counter() if started is None else started
    first: float | None = None
    batches = samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter()
        batches += 1
        samples += batch_size_of(batch)
        if on_batch is not None:
            on_batch(batches, samples)
        if max_batches is not None and batches >= max_batches:
            break
    end = time.perf_counter()
    return EpochTiming(
        time_to_first_batch_s=(first if first is not None else end) - start,
        epoch_s=end - start,
        batches=batches,
        samples=samples,
    )


def load_class(spec: str) -> type[Any]:
    """Import "package.module:Name" and return the attribute, raising ImportError that says
    which half failed."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"loader spec must look like 'package.module:Name', got {spec!r}")
    module = importlib.import_module(module_name)
    try:
        cls: type[Any] = getattr(module, attr)
    except AttributeError:
        raise ImportError(
            f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no {attr!r}"
        ) from None
    return cls


def loader_label(spec: str) -> str:
    """Short name for a loader spec in tables: "stoker" for stoker's, "torch-2" for torch's
    own class measured against itself (an A/A run), else the top-level package name."""
    if spec == BASELINE:
        return "torch-2"
    return spec.partition(":")[0].split(".")[0]


# ---------------------------------------------------------------------------------------------
# `stoker demo`
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoOptions:
    """Arguments of `stoker demo` (see `stoker.cli`)."""

    images: int = 512
    epochs: int = 1
    num_workers: int = 2
    batch_size: int = 64
    candidate: str = CANDIDATE
    rounds: int = 3  # runs of each tier, order rotating; the table shows medians
    packed: bool = False  # also the files packed by `stoker pack`, read by TarShards


@dataclass(frozen=True)
class DemoResult:
    """What one loader did in the demo: all epochs together, plus its stats() line if any."""

    samples_per_s: float
    time_to_first_batch_s: float
    peak_pss_mib: float
    stats_line: str | None


class ProgressBar:
    """A one-line progress bar on stderr: redrawn in place at most 10 times a second on a
    terminal, written once at the end otherwise (so logs and pipes stay readable).
    `update()` takes counts within the current epoch; `end_epoch()` carries them over."""

    def __init__(self, label: str, total_batches: int, stream: Any = None) -> None:
        self.label, self.total = label, max(total_batches, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._drawn = 0.0
        self._line = ""
        self._done = [0, 0]  # batches, samples of finished epochs
        self._epoch = [0, 0]  # batches, samples of the current epoch

    def update(self, batches: int, samples: int) -> None:
        self._epoch = [batches, samples]
        done, seen = self._done[0] + batches, self._done[1] + samples
        now = time.perf_counter()
        filled = min(20, 20 * done // self.total)
        self._line = (
            f"{self.label:<11} [{'#' * filled}{'.' * (20 - filled)}] {done}/{self.total} batches"
            f"  {seen / max(now - self.start, 1e-9):8.1f} samples/s"
        )
        if self.live and (now - self._drawn >= 0.1 or done >= self.total):
            self._drawn = now
            self.stream.write("\r" + self._line)
            self.stream.flush()

    def end_epoch(self) -> None:
        self._done = [self._done[0] + self._epoch[0], self._done[1] + self._epoch[1]]
        self._epoch = [0, 0]

    def close(self) -> None:
        self.stream.write(("\r" if self.live else "") + self._line + "\n")
        self.stream.flush()


def _stats_line(loader: Iterable[Any]) -> str | None:
    """The first line of `loader.stats()` (its input-bound verdict), when the loader has it."""
    stats = getattr(loader, "stats", None)
    if stats is None:
        return None
    try:
        text = str(stats())
    except Exception as exc:  # the demo's measurements stand even if stats() is broken
        return f"loader.stats() failed: {type(exc).__name__}: {exc}"
    return text.strip().splitlines()[0] if text.strip() else None


def _measure(
    name: str, loader_cls: type[Any], dataset: Any, opts: DemoOptions, mem: Any
) -> DemoResult:
    batches_per_epoch = math.ceil(len(dataset) / opts.batch_size)
    bar = ProgressBar(name, batches_per_epoch * opts.epochs)
    mem.reset()
    started = time.perf_counter()
    loader = loader_cls(
        dataset, batch_size=opts.batch_size, shuffle=True, num_workers=opts.num_workers
    )
    timings: list[EpochTiming] = []
    for epoch in range(opts.epochs):
        first = started if epoch == 0 else None
        timings.append(time_epoch(loader, started=first, on_batch=bar.update))
        bar.end_epoch()
    bar.close()
    stats_line = _stats_line(loader)
    del loader
    mem.sample()
    total_s = sum(t.epoch_s for t in timings)
    return DemoResult(
        samples_per_s=sum(t.samples for t in timings) / total_s if total_s > 0 else 0.0,
        time_to_first_batch_s=timings[0].time_to_first_batch_s,
        peak_pss_mib=mem.peak_mib,
        stats_line=stats_line,
    )


def median_result(runs: list[DemoResult]) -> DemoResult:
    """Each measure's median over runs of one loader; the last run's stats line."""
    return DemoResult(
        samples_per_s=statistics.median(r.samples_per_s for r in runs),
        time_to_first_batch_s=statistics.median(r.time_to_first_batch_s for r in runs),
        peak_pss_mib=statistics.median(r.peak_pss_mib for r in runs),
        stats_line=runs[-1].stats_line,
    )


def run_demo(opts: DemoOptions) -> int:
    """`stoker demo`: the same JPEG files through each tier (``demo_tiers.py``): torch's
    DataLoader on a torchvision pipeline, stoker's drop-in, the pipeline from stoker.vision,
    a hand-written ``__getitem__`` on stoker's image path (and, with ``--packed``, a pack)."""
    try:
        load_class(opts.candidate)
    except (ImportError, ValueError) as exc:
        print(
            f"stoker demo: cannot load the loader to compare, {opts.candidate!r}: {exc}",
            file=sys.stderr,
        )
        return 1
    with tempfile.TemporaryDirectory(prefix="stoker-demo-") as tmp:
        print(f"writing {opts.images} synthetic JPEGs to {tmp} ...", file=sys.stderr)
        paths = make_jpeg_files(os.path.join(tmp, "files"), opts.images)
        packed = None
        if opts.packed and opts.candidate == CANDIDATE:
            print("packing them with stoker pack ...", file=sys.stderr)
            packed = pack_files(paths, tmp)
        tiers = build_tiers(paths, opts.candidate, packed, link_folder(paths, tmp))
        runs = _run_tiers(tiers, opts)
    results = [median_result(r) for r in runs]
    _print_results(opts, tiers, runs, results)
    return 0


def _run_tiers(tiers: list[Tier], opts: DemoOptions) -> list[list[DemoResult]]:
    runs: list[list[DemoResult]] = [[] for _ in tiers]
    with TreeMemorySampler() as mem:
        # A core's speed drifts within seconds on shared machines: rotate the order each
        # round and report medians, so no tier always runs in the better moment.
        for r in range(opts.rounds):
            tag = f" {r + 1}/{opts.rounds}" if opts.rounds > 1 else ""
            order = list(range(len(tiers)))
            for k in order[r % len(order):] + order[: r % len(order)]:
                cls = load_class(tiers[k].loader)
                runs[k].append(_measure(tiers[k].key + tag, cls, tiers[k].dataset, opts, mem))
    return runs


def _print_results(opts: DemoOptions, tiers: list[Tier], runs: list[list[DemoResult]],
                   results: list[DemoResult]) -> None:
    print(
        f"stoker demo: {opts.images} JPEGs -> random-resized-crop {CROP_SIZE} + flip (+ "
        "ToTensor, Normalize in tiers 1-3), "
        f"batch_size={opts.batch_size}, num_workers={opts.num_workers}, "
        f"epochs={opts.epochs}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    if opts.rounds > 1:
        print(f"medians of {opts.rounds} runs each, order rotating; "
              f"samples/s over torch's, run by run: {run_by_run(tiers, runs)}")
    print(format_tiers(tiers, results))
    print(f"tier 1 pipeline: {torchvision_modules()[2]}")
    if any(t.key == "image path" for t in tiers):
        print(decoder_line())
    if opts.packed and opts.candidate != CANDIDATE:
        print("--packed: not run (the pack's tier needs stoker's loader, not "
              f"{opts.candidate})")
    if results[1].stats_line is not None:
        print(f"{tiers[1].key} stats: {results[1].stats_line}")
    print(verdict(tiers, results))
