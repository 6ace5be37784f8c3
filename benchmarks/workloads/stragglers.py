"""`stragglers`: CPU-bound samples where a few take far longer than the rest (a huge image, a
long clip). torch hands each worker whole batches in turn; a batch queued behind a slow one
waits for it while the other worker runs out of work. stoker moves such a batch to the idle
worker (NOTE [ Idle workers take queued tasks ])."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from _harness import Context, Plan, compare

FAST_S, SLOW_S = 0.001, 0.25


class StragglerDataset(torch.utils.data.Dataset[torch.Tensor]):
    """`n` samples of `FAST_S` CPU time; the first sample of one batch in 16 (chosen by a fixed
    seed) takes `slow_s`. Returns float32[1024]."""

    def __init__(self, n: int, batch_size: int, slow_s: float = SLOW_S) -> None:
        batches = n // batch_size
        rng = np.random.default_rng(0)
        slow = rng.choice(batches, max(1, batches // 16), replace=False) * batch_size
        self.cost = np.full(n, FAST_S)
        self.cost[slow] = slow_s

    def __len__(self) -> int:
        return len(self.cost)

    def __getitem__(self, index: int) -> torch.Tensor:
        end = time.thread_time() + self.cost[index]
        while time.thread_time() < end:  # CPU work, not a wait
            pass
        return torch.full((1024,), float(index))


def run(ctx: Context) -> list[dict[str, Any]]:
    n, batch = (256, 16) if ctx.quick else (2048, 16)
    dataset = StragglerDataset(n, batch, slow_s=0.05 if ctx.quick else SLOW_S)
    kwargs = {"batch_size": batch, "num_workers": 2}
    plan = Plan(epochs=1 if ctx.quick else 2, warmup_batches=2)

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        cpu_s = float(dataset.cost.sum())
        return {"cpu_s_per_epoch": cpu_s, "two_core_bound_s": cpu_s / 2}

    return compare(ctx, "stragglers", dataset, kwargs, plan, extra=extra)
