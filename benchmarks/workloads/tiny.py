"""`tiny`: many tiny in-memory samples. Measures per-sample and per-batch overhead of the
loader itself (fetch loop, collate of dicts, inter-process transfer), num_workers 0 and 2, and
the same tensors in a `torch.utils.data.TensorDataset` with num_workers 2; num_workers 0 once
more with the two loaders' epochs alternating (`epoch_ratios`).

Each record also carries `two_process_plain_samples_per_s`: two forked processes doing only
the user's work (`default_collate([dataset[i] for i in batch])` over shuffled batches, no
loader) at once, measured right before and right after the loader's run (`reference_before`,
`reference_after`; their mean). Any loader that keeps torch's run (torch's collate, in worker
processes) does at least this work per batch, so this rate bounds it on two cores;
`fraction_of_two_process_plain` is the loader's share of it (issue 45's goal: >= 0.8 at
num_workers=2). `benchmarks/overhead_profile.py` splits the rest by CPU time.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import torch
from _harness import Context, Plan, compare, compare_interleaved
from torch.utils.data import default_collate


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


def _plain_batches(dataset: Any, order: list[int], batch_size: int, out: Any) -> None:
    # One thread, as torch's workers run (and an OpenMP pool does not survive a fork).
    torch.set_num_threads(1)
    default_collate([dataset[i] for i in order[:batch_size]])  # warm-up, not timed
    start = time.perf_counter()
    for b in range(len(order) // batch_size):
        default_collate([dataset[i] for i in order[b * batch_size:(b + 1) * batch_size]])
    out.put((start, time.perf_counter()))


def two_process_plain_rate(dataset: Any, batches: int, batch_size: int = 256) -> float:
    """Samples/s of two forked processes each collating `batches` shuffled batches of
    `dataset` in a plain loop, at once (first start to last end; the clock is system-wide)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    orders = [torch.randperm(len(dataset), generator=torch.Generator().manual_seed(k)).tolist()
              [:batches * batch_size] for k in range(2)]
    procs = [ctx.Process(target=_plain_batches, args=(dataset, order, batch_size, out))
             for order in orders]
    for p in procs:
        p.start()
    spans = [out.get(timeout=300) for _ in procs]  # a dead loop raises queue.Empty
    for p in procs:
        p.join(timeout=60)
    return 2 * batches * batch_size / (max(e for _, e in spans) - min(s for s, _ in spans))


def _bound(record: dict[str, Any]) -> dict[str, Any]:
    rate = (record["reference_before"] + record["reference_after"]) / 2
    return {"two_process_plain_samples_per_s": rate,
            "fraction_of_two_process_plain": record["samples_per_s"] / rate}


def run(ctx: Context) -> list[dict[str, Any]]:
    dataset = TinyDataset(10_000 if ctx.quick else 200_000)
    plan = Plan(epochs=1, warmup_batches=2) if ctx.quick else Plan(epochs=3, warmup_batches=8)
    batches = 20 if ctx.quick else 400
    records = []
    for workers in (0, 2):
        kwargs = {"batch_size": 256, "shuffle": True, "num_workers": workers}
        records += compare(ctx, "tiny", dataset, kwargs, plan, variant=f"num_workers={workers}",
                           extra=_bound, reference=lambda: two_process_plain_rate(dataset, batches))
    # A 0.46 s epoch at num_workers=0 swings by a few percent on a VM, about what a loader can
    # save there (the rest is the user's __getitem__ and default_collate): alternating the
    # loaders' epochs over many rounds tells it apart, as for `per_sample`.
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 0}
    records += compare_interleaved(ctx, "tiny", dataset, kwargs, rounds=2 if ctx.quick else 12,
                                   variant="num_workers=0, epochs interleaved")
    tensors = torch.utils.data.TensorDataset(dataset.x, dataset.y)
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 2}
    records += compare(ctx, "tiny", tensors, kwargs, plan, variant="TensorDataset, num_workers=2",
                       extra=_bound, reference=lambda: two_process_plain_rate(tensors, batches))
    return records
