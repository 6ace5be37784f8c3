"""`tiny`: many tiny in-memory samples. Measures per-sample and per-batch overhead of the
loader itself (fetch loop, collate of dicts, inter-process transfer), num_workers 0 and 2, and
the same tensors in a `torch.utils.data.TensorDataset` with num_workers 2."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Context, Plan, compare


class TinyDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """`n` samples of {'x': float32[64] row view, 'y': int}, held in preallocated tensors."""

    def __init__(self, n: int, dim: int = 64, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=gen)
        self.y = torch.randint(0, 1000, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": int(self.y[index])}


def run(ctx: Context) -> list[dict[str, Any]]:
    dataset = TinyDataset(10_000 if ctx.quick else 200_000)
    plan = Plan(epochs=1, warmup_batches=2) if ctx.quick else Plan(epochs=3, warmup_batches=8)
    records = []
    for workers in (0, 2):
        kwargs = {"batch_size": 256, "shuffle": True, "num_workers": workers}
        records += compare(ctx, "tiny", dataset, kwargs, plan, variant=f"num_workers={workers}")
    tensors = torch.utils.data.TensorDataset(dataset.x, dataset.y)
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 2}
    records += compare(ctx, "tiny", tensors, kwargs, plan, variant="TensorDataset, num_workers=2")
    return records
