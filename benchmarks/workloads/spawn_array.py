"""`spawn_array`: a dataset holding a 256 MiB numpy array, workers started with `spawn`.
torch pickles the dataset once per worker and each worker unpickles its own copy, as stoker
does by default; with `STOKER_BEYOND_TORCH=pickle_once` (or `=1`) stoker pickles it once and
the workers map the array's pages from one shared segment (NOTE [ Pickle once ]). One epoch,
num_workers=2, batch 64, no warm-up: compare
`time_to_first_batch_s` (start-up included) and `peak_pss_mib` / `peak_pss_ratio_to_before`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from _harness import Context, Plan, compare


class ArrayDataset(torch.utils.data.Dataset[torch.Tensor]):
    """`dataset[i]` is a copy of one 64-float row of an in-memory array of `mib` MiB."""

    def __init__(self, mib: int) -> None:
        rows = mib * 2**20 // (64 * 8)
        self.rows = np.random.default_rng(0).random((rows, 64))

    def __len__(self) -> int:
        return 8192

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.rows[index * 7919 % len(self.rows)].copy())


def run(ctx: Context) -> list[dict[str, Any]]:
    mib = 16 if ctx.quick else 256
    dataset = ArrayDataset(mib)
    kwargs = {"batch_size": 64, "num_workers": 2, "multiprocessing_context": "spawn"}

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        return {"array_mib": mib}

    plan = Plan(epochs=1, warmup_batches=0)
    return compare(ctx, "spawn_array", dataset, kwargs, plan, extra=extra)
