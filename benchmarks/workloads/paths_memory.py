"""`paths_memory`: dataset metadata in a plain Python list (2,000,000 path strings). With
fork-started workers, reading the list bumps refcounts and copies its pages into every
worker (copy-on-read), so the process tree's PSS grows towards (1 + num_workers) x the list.
One epoch, num_workers=2, batch 256; reports peak PSS and its ratio to the PSS before the
loader was built."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Context, Plan, compare


class PathsDataset(torch.utils.data.Dataset[int]):
    """`n` file-path strings in a Python list; `dataset[i]` is the UTF-8 length of path i."""

    def __init__(self, n: int) -> None:
        self.paths = [f"/data/train/class_{i % 1000}/img_{i:08d}.jpg" for i in range(n)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        return len(self.paths[index].encode())


def run(ctx: Context) -> list[dict[str, Any]]:
    n = 50_000 if ctx.quick else 2_000_000
    dataset = PathsDataset(n)
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 2}

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        return {"paths": n}

    plan = Plan(epochs=1, warmup_batches=0)
    return compare(ctx, "paths_memory", dataset, kwargs, plan, extra=extra)
