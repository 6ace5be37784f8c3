"""`per_sample`: an in-memory dataset whose `__getitem__` has a branch and calls a helper
method, so no batched form applies and every sample is fetched by calling it: 200k samples of
64 floats, batch 256, num_workers 0 (the calling thread, stoker's inline iterator) and 2.
stoker must never be slower than torch here: the per-sample loop is the loader's own cost."""

from __future__ import annotations

import statistics
import time
from typing import Any

from _harness import Context, Plan, compare, compare_interleaved, time_epoch

from workloads.tiny import TinyDataset


class BranchyDataset(TinyDataset):
    """`tiny`'s samples, fetched through a branch (odd samples negated) and a helper method."""

    def _label(self, index: int) -> int:
        return int(self.y[index])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index % 2:
            return {"x": -self.x[index], "y": self._label(index)}
        return {"x": self.x[index], "y": self._label(index)}


def run(ctx: Context) -> list[dict[str, Any]]:
    dataset = BranchyDataset(10_000 if ctx.quick else 200_000)
    plan = Plan(epochs=1, warmup_batches=2) if ctx.quick else Plan(epochs=3, warmup_batches=8)
    records = []
    for workers in (0, 2):
        kwargs = {"batch_size": 256, "shuffle": True, "num_workers": workers}
        records += compare(ctx, "per_sample", dataset, kwargs, plan,
                           variant=f"num_workers={workers}")
    # A 0.7 s epoch swings by +-15% on a shared machine: alternating the two loaders' epochs
    # over many rounds (per-round ratios in `epoch_ratios`) is what can tell a few percent.
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 0}
    records += compare_interleaved(ctx, "per_sample", dataset, kwargs,
                                   rounds=2 if ctx.quick else 12,
                                   variant="num_workers=0, epochs interleaved")
    records += cpu_time(ctx, dataset, kwargs, rounds=2 if ctx.quick else 10)
    return records


def cpu_time(ctx: Context, dataset: Any, kwargs: dict[str, Any], rounds: int) -> list[dict]:
    """With num_workers=0 all of an epoch runs in this thread, so its CPU time (not disturbed
    by other processes, unlike wall time) is the loader's cost plus the dataset's. Epochs of
    the two loaders alternate; `samples_per_s` here is samples per CPU-second (the median),
    `epoch_s` the median CPU seconds, `time_to_first_batch_s` the median wall time to an
    epoch's first batch, `peak_pss_mib` the peak over the loader's own epochs."""
    loaders = {name: cls(dataset, **kwargs) for name, cls in ctx.loaders.items()}
    for loader in loaders.values():  # warm-up epoch each
        time_epoch(loader)
    spent: dict[str, list[float]] = {name: [] for name in loaders}
    firsts: dict[str, list[float]] = {name: [] for name in loaders}
    peaks = dict.fromkeys(loaders, 0.0)
    for r in range(rounds):
        for name in loaders if r % 2 == 0 else list(loaders)[::-1]:
            ctx.sampler.reset()
            start = time.thread_time()
            timing = time_epoch(loaders[name])
            spent[name].append(time.thread_time() - start)
            firsts[name].append(timing.time_to_first_batch_s)
            ctx.sampler.sample()
            peaks[name] = max(peaks[name], ctx.sampler.peak_mib)
    records = []
    for name, seconds in spent.items():
        cpu = statistics.median(seconds)
        records.append({
            "workload": "per_sample", "variant": "num_workers=0, CPU time", "loader": name,
            "samples_per_s": len(dataset) / cpu, "epoch_s": cpu, "cpu_s_per_epoch_all": seconds,
            "time_to_first_batch_s": statistics.median(firsts[name]),
            "peak_pss_mib": peaks[name], "machine": ctx.machine,
            "loader_kwargs": {k: repr(v) for k, v in kwargs.items()},
        })
    return records
