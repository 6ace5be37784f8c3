"""Measures torch's DataLoader and a candidate loader on the same Dataset object with the same
arguments, one comparison at a time, and turns each loader's run into a JSON-ready record.

Per loader: build it, run a warm-up (a few batches or a whole epoch; it gives the cold time to
first batch and is otherwise discarded), then `epochs` measured epochs (median reported), while
a background thread samples the PSS of the whole process tree (main process + workers). The
order of the two loaders alternates from one comparison to the next.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stoker.cli.demo import (
    BASELINE,
    EpochTiming,
    TreeMemorySampler,
    load_class,
    loader_label,
    time_epoch,
    tree_pss_bytes,
)

REPO = Path(__file__).resolve().parent.parent


def machine_info() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def _git(*args: str) -> str:
    command = ["git", "-C", str(REPO), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout


def _git_revision() -> str:
    try:
        rev = _git("rev-parse", "--short", "HEAD").strip()
        dirty = _git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+uncommitted changes" if dirty else "")


def _origin(cls: type[Any]) -> str:
    module = sys.modules.get(cls.__module__)
    return f"{cls.__module__}.{cls.__qualname__} from {getattr(module, '__file__', '?')}"


@dataclass
class Context:
    """Everything a workload needs: the two loader classes, size mode, and the sampler."""

    quick: bool
    candidate_spec: str
    loaders: dict[str, type[Any]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine_info)
    sampler: TreeMemorySampler = field(default_factory=TreeMemorySampler)
    comparisons: int = 0

    @classmethod
    def create(cls, quick: bool, candidate_spec: str) -> Context:
        """Import both loader classes; a candidate that does not import is a loud error."""
        ctx = cls(quick=quick, candidate_spec=candidate_spec)
        ctx.loaders["torch"] = load_class(BASELINE)
        ctx.loaders[loader_label(candidate_spec)] = load_class(candidate_spec)
        return ctx

    @property
    def candidate(self) -> str:
        return loader_label(self.candidate_spec)

    def provenance(self) -> list[str]:
        """Where the figures come from, one line each."""
        import stoker

        return [
            f"baseline  torch: {_origin(self.loaders['torch'])} (torch {torch.__version__})",
            f"candidate {self.candidate}: {_origin(self.loaders[self.candidate])}",
            f"stoker {getattr(stoker, '__version__', '?')} from {Path(stoker.__file__).parent}, "
            f"git {_git_revision()}",
            f"machine: {self.machine}",
            "both loaders run in this one process, on the same Dataset object with the same "
            "arguments; order alternates between comparisons",
        ]


@dataclass(frozen=True)
class Plan:
    """How to measure one loader: warm-up size and measured epochs."""

    epochs: int = 3
    warmup_batches: int | None = None  # None: a whole epoch; 0: no warm-up


def _median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def measure(
    ctx: Context, name: str, dataset: Any, kwargs: dict[str, Any], plan: Plan
) -> dict[str, Any]:
    """Build loader `name` on `dataset` with `kwargs`, warm it up, time `plan.epochs` epochs."""
    gc.collect()
    pss_before = tree_pss_bytes() / 2**20
    ctx.sampler.reset()
    started = time.perf_counter()
    loader = ctx.loaders[name](dataset, **kwargs)
    timings: list[EpochTiming] = []
    cold_ttfb: float | None = None
    if plan.warmup_batches != 0:
        warm = time_epoch(loader, started=started, max_batches=plan.warmup_batches)
        cold_ttfb = warm.time_to_first_batch_s
    for i in range(plan.epochs):
        first_measured = i == 0 and cold_ttfb is None
        timings.append(time_epoch(loader, started=started if first_measured else None))
    if cold_ttfb is None:
        cold_ttfb = timings[0].time_to_first_batch_s
    ctx.sampler.sample()
    peak = ctx.sampler.peak_mib
    del loader
    gc.collect()
    return {"loader": name, **_epoch_fields(timings, cold_ttfb, peak, pss_before)}


def _epoch_fields(
    timings: list[EpochTiming], cold_ttfb: float, peak: float, pss_before: float
) -> dict[str, Any]:
    """A record's figures from one loader's measured epochs (the median epoch counts)."""
    epoch_s = _median(t.epoch_s for t in timings)
    return {
        "samples_per_s": timings[0].samples / epoch_s if epoch_s > 0 else 0.0,
        "time_to_first_batch_s": cold_ttfb,
        "epoch_s": epoch_s,
        "epoch_s_min": min(t.epoch_s for t in timings),
        "epochs_measured": len(timings),
        "warm_time_to_first_batch_s": _median(t.time_to_first_batch_s for t in timings),
        "samples_per_epoch": timings[0].samples,
        "batches_per_epoch": timings[0].batches,
        "peak_pss_mib": peak,
        "pss_before_mib": pss_before,
        "peak_pss_ratio_to_before": peak / pss_before if pss_before > 0 else 0.0,
    }


def _loader_order(ctx: Context) -> list[str]:
    """The loaders in the order to run them; it alternates from one comparison to the next."""
    names = list(ctx.loaders)
    if ctx.comparisons % 2:
        names.reverse()
    ctx.comparisons += 1
    return names


def _finish(
    ctx: Context, records: list[dict[str, Any]],
    extra: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> list[dict[str, Any]]:
    """Add the workload's own fields and the machine to each record; torch's first."""
    for record in records:
        if extra is not None:
            record.update(extra(record))
        record["machine"] = ctx.machine
    records.sort(key=lambda r: r["loader"] != "torch")
    return records


def compare(
    ctx: Context,
    workload: str,
    dataset: Any,
    kwargs: dict[str, Any],
    plan: Plan,
    variant: str = "",
    extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    reference: Callable[[], float] | None = None,
) -> list[dict[str, Any]]:
    """Measure torch's loader and the candidate on the same dataset and kwargs; one record
    each. `extra(record)` may add workload-specific fields.

    `reference()`, if given, is a rate measured right before and right after each loader's run
    (`reference_before`/`reference_after` in its record): on a shared machine the speed of a
    core drifts within seconds, so a loader is compared with the machine as it was meanwhile.
    """
    records = []
    for position, name in enumerate(_loader_order(ctx)):
        record: dict[str, Any] = {"workload": workload, "variant": variant}
        before = reference() if reference is not None else None
        record.update(measure(ctx, name, dataset, kwargs, plan))
        if reference is not None:
            record["reference_before"], record["reference_after"] = before, reference()
        record["run_position"] = position
        record["loader_kwargs"] = {k: repr(v) for k, v in kwargs.items()}
        records.append(record)
    return _finish(ctx, records, extra)


def compare_interleaved(
    ctx: Context,
    workload: str,
    dataset: Any,
    kwargs: dict[str, Any],
    rounds: int,
    variant: str,
    extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Like `compare`, but both loaders live through the whole comparison and their epochs
    alternate (A B, B A, A B, ...): a machine whose speed drifts within seconds slows both
    alike. Each loader's record is the median of its `rounds` epochs (after a one-batch
    warm-up each), and its `epoch_ratios` lists torch's epoch time over its own, round by
    round. Peak PSS is taken over the loader's own epochs; only loaders whose workers exit
    between epochs (no `persistent_workers`) keep the two loaders' figures apart.
    """
    names = _loader_order(ctx)
    gc.collect()
    pss_before = tree_pss_bytes() / 2**20
    loaders: dict[str, Any] = {}
    cold: dict[str, float] = {}
    for name in names:
        started = time.perf_counter()
        loaders[name] = ctx.loaders[name](dataset, **kwargs)
        cold[name] = time_epoch(
            loaders[name], started=started, max_batches=1
        ).time_to_first_batch_s
    timings: dict[str, list[EpochTiming]] = {name: [] for name in names}
    peaks: dict[str, float] = dict.fromkeys(names, 0.0)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            ctx.sampler.reset()
            timings[name].append(time_epoch(loaders[name]))
            ctx.sampler.sample()
            peaks[name] = max(peaks[name], ctx.sampler.peak_mib)
    del loaders
    gc.collect()
    records = [
        {
            "workload": workload, "variant": variant, "loader": name,
            **_epoch_fields(timings[name], cold[name], peaks[name], pss_before),
            "run_position": position,
            "loader_kwargs": {k: repr(v) for k, v in kwargs.items()},
            "epoch_ratios": [
                base.epoch_s / own.epoch_s
                for base, own in zip(timings["torch"], timings[name], strict=True)
            ],
        }
        for position, name in enumerate(names)
    ]
    return _finish(ctx, records, extra)
