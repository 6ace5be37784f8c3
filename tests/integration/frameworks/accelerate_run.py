"""Run under ``torchrun --nproc_per_node 2`` (gloo, CPU): Accelerate keeps stoker's engine.

Each rank writes what it saw to ``<out>/rank<r>.json``; the test asserts on the union.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from accelerate import Accelerator, skip_first_batches
from torch.utils.data import Dataset

import stoker

N, BATCH = 16, 2


class Indices(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def main(out: str) -> None:
    warnings.simplefilter("error", RuntimeWarning)  # a bypass warning fails the run
    accelerator = Accelerator(cpu=True)
    dataset = Indices()
    loader = stoker.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0),
        num_workers=2, worker_type="thread",
    )
    prepared = accelerator.prepare(loader)
    epoch = [b.tolist() for b in prepared]
    base = prepared.base_dataloader
    rest = skip_first_batches(prepared, 2)
    resumed = [b.tolist() for b in rest]
    record = {
        "rank": accelerator.process_index,
        "world": accelerator.num_processes,
        "backend": str(accelerator.state.backend),
        "base_type": type(base).__module__ + "." + type(base).__qualname__,
        "base_worker_type": base.worker_type,
        "base_batches": base.stats().batches,
        "epoch": epoch,
        "skip_type": type(rest.base_dataloader).__qualname__,
        "skip_batches": rest.base_dataloader.stats().batches,
        "resumed": resumed,
    }
    with open(f"{out}/rank{accelerator.process_index}.json", "w") as f:
        json.dump(record, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
