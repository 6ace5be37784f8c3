"""`per_sample`: an in-memory dataset whose `__getitem__` has a branch and calls a helper
method, so no batched form applies and every sample is fetched by calling it: 200k samples of
64 floats, batch 256, num_workers 0 (the calling thread, stoker's inline iterator) and 2.
stoker must never be slower than torch here: the per-sample loop is the loader's own cost."""

from __future__ import annotations

from typing import Any

from _harness import Context, Plan, compare, compare_interleaved

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
    return records
