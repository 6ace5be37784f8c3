"""`remote_get`: an I/O-bound dataset whose every sample waits 8 ms, like a GET from object
storage. Process workers alone give num_workers concurrent waits; a loader that overlaps
fetches (threads, async) can go far beyond that on the same two cores.

Two variants: the dataset as users write it (`default`: stoker fetches one sample at a time
per worker, as torch does, since thread-safety cannot be detected), and the same dataset whose
class declares `stoker_thread_safe = True` (`thread_safe`: the opt-in; torch ignores the
attribute), which lets stoker's workers run fetches on threads."""

from __future__ import annotations

import time
from typing import Any

import torch
from _harness import Context, Plan, compare

LATENCY_S = 0.008


class RemoteGetDataset(torch.utils.data.Dataset[torch.Tensor]):
    """`n` samples; each `__getitem__` sleeps LATENCY_S (the simulated GET, not a test
    delay) and returns a small float32[16] tensor."""

    def __init__(self, n: int, latency_s: float = LATENCY_S) -> None:
        self.n = n
        self.latency_s = latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.latency_s)
        return torch.full((16,), float(index))


class ThreadSafeRemoteGetDataset(RemoteGetDataset):
    """The same samples; the class promises that `__getitem__` is thread-safe (NOTE
    [ Automatic concurrency ])."""

    stoker_thread_safe = True


def run(ctx: Context) -> list[dict[str, Any]]:
    n = 128 if ctx.quick else 3000
    batch = 16 if ctx.quick else 32
    kwargs = {"batch_size": batch, "shuffle": True, "num_workers": 2}
    plan = Plan(epochs=1, warmup_batches=2 if ctx.quick else 4)

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        return {
            "latency_s": LATENCY_S,
            "serial_epoch_s": n * LATENCY_S,
            "effective_concurrency": n * LATENCY_S / record["epoch_s"],
        }

    records = []
    variants = (("default", RemoteGetDataset), ("thread_safe", ThreadSafeRemoteGetDataset))
    for variant, cls in variants:
        records += compare(ctx, "remote_get", cls(n), kwargs, plan, variant=variant, extra=extra)
    return records
