"""`startup`: a near-zero-cost dataset, so what is measured is the loader's own cost: time to
first batch (cold: from building the loader), time to first batch of later epochs, and the
per-epoch overhead (epoch time minus the samples' cost, measured as a plain in-process loop of
fetch + collate), with persistent_workers False and True, num_workers=2."""

from __future__ import annotations

import time
from typing import Any

import torch
from _harness import Context, Plan, compare
from torch.utils.data import BatchSampler, RandomSampler, default_collate


class CheapDataset(torch.utils.data.Dataset[int]):
    """`n` samples; `dataset[i] == i`."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def samples_cost_s(dataset: CheapDataset, batch_size: int, repeats: int = 3) -> float:
    """Best-of-`repeats` seconds to fetch and collate one epoch in a plain loop."""
    best = float("inf")
    for _ in range(repeats):
        batches = BatchSampler(RandomSampler(dataset), batch_size, drop_last=False)
        start = time.perf_counter()
        for indices in batches:
            default_collate([dataset[i] for i in indices])
        best = min(best, time.perf_counter() - start)
    return best


def run(ctx: Context) -> list[dict[str, Any]]:
    dataset = CheapDataset(2_000 if ctx.quick else 20_000)
    batch_size = 64
    cost = samples_cost_s(dataset, batch_size)
    plan = Plan(epochs=2 if ctx.quick else 5)

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        return {"samples_cost_s": cost, "per_epoch_overhead_s": record["epoch_s"] - cost}

    records = []
    for persistent in (False, True):
        kwargs = {
            "batch_size": batch_size,
            "shuffle": True,
            "num_workers": 2,
            "persistent_workers": persistent,
        }
        variant = f"persistent_workers={persistent}"
        records += compare(ctx, "startup", dataset, kwargs, plan, variant=variant, extra=extra)
    return records
