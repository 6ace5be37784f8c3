"""Lightning (CPU, 2 processes, gloo) fitting on a stoker loader built BEFORE ``fit``:
``python lightning_run.py OUT STRATEGY SHARD`` with STRATEGY ``ddp`` (Lightning re-runs this
script per rank, with WORLD_SIZE set before RANK and the process group exist) or ``ddp_spawn``
(the loader is pickled into the spawned ranks), SHARD ``0`` (Lightning injects a
DistributedSampler and rebuilds the loader) or ``1`` (``shard=True``: stoker's sampler is a
DistributedSampler, left in place). Each rank writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
import traceback

import lightning as L
import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

import stoker

N = 16



def in_stoker_worker() -> bool:
    """Whether this fetch runs in a stoker worker process (in a worker, with stoker's code on
    the stack): the worker's ``get_worker_info()`` is torch's own record, so only the stack
    tells."""
    return get_worker_info() is not None and any(
        "/stoker/" in frame.filename for frame in traceback.extract_stack())

class Samples(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"i": torch.tensor(i), "engine": torch.tensor(int(in_stoker_worker()))}


class Module(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.out = out
        self.seen: list[int] = []
        self.engine: list[int] = []

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        self.seen += batch["i"].tolist()
        self.engine += batch["engine"].tolist()
        return self.lin(batch["i"].float()[:, None]).sum()

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_end(self) -> None:
        loader = self.trainer.train_dataloader
        record = {
            "rank": self.global_rank, "world": self.trainer.world_size, "seen": self.seen,
            "engine": self.engine, "loader": type(loader).__qualname__,
            "sampler": type(loader.sampler).__qualname__, "batches": loader.stats().batches,
            "backend": torch.distributed.get_backend(),
        }
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as f:
            json.dump(record, f)


def main(out: str, strategy: str, shard: bool) -> None:
    loader = stoker.DataLoader(  # built before fit, in every process Lightning starts
        Samples(), batch_size=2, shuffle=True, num_workers=1, worker_type="process", shard=shard,
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Module(out), train_dataloaders=loader)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "1")
