"""Lightning (CPU, 2 processes, gloo), ``seed_everything(7, workers=True)``, a mid-epoch
``ModelCheckpoint`` and a resume in a new process: ``python lightning_resume_run.py OUT PHASE
STRATEGY WORKERS`` with PHASE ``save`` (the whole epoch, a checkpoint every 3 steps) or ``load``
(``fit(ckpt_path=<the step-3 checkpoint>)``), STRATEGY ``ddp`` or ``ddp_spawn``, WORKERS ``1``
(``seed_everything(7, workers=True)``) or ``0``.

Lightning writes rank 0's checkpoint and loads it on every rank; its ``worker_init_fn`` seeds
each worker from the rank, so rank 1's workers draw other numbers than rank 0's: every sample
carries a draw of its worker's stream, and a rank resumed with rank 0's worker streams would
show it. Each rank writes ``OUT/<PHASE>_rank<r>.json``: the batches it trained on (ids and
draws) and what stoker said.
"""

from __future__ import annotations

import json
import sys
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import Dataset

import stoker

N = 24


class Draws(Dataset):
    """Sample ``i`` is ``[i, a draw from the fetching worker's torch stream]``."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, int(torch.randint(0, 2**30, ()))])


class Module(L.LightningModule):
    def __init__(self, out: str, phase: str) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.out, self.phase = out, phase
        self.batches: list[list[list[int]]] = []
        self.told: list[str] = []

    def setup(self, stage: str) -> None:
        # In each rank's process (ddp_spawn starts new ones): what stoker says from here on.
        show = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
            if "/stoker/" in filename or "load_state_dict" in str(message):
                self.told.append(str(message))
            show(message, category, filename, lineno, file, line)

        warnings.simplefilter("always")
        warnings.showwarning = record

    def train_dataloader(self):  # noqa: ANN201
        return stoker.DataLoader(Draws(), batch_size=2, shuffle=True, num_workers=2,
                                 timeout=60)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        self.batches.append(batch.tolist())
        return self.lin(batch[:, :1].float()).sum()

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_end(self) -> None:
        record = {"rank": self.global_rank, "batches": self.batches, "told": self.told,
                  "sampler": type(self.trainer.train_dataloader.sampler).__qualname__}
        with open(f"{self.out}/{self.phase}_rank{self.global_rank}.json", "w") as f:
            json.dump(record, f)


def main(out: str, phase: str, strategy: str, workers: str) -> None:
    L.seed_everything(7, workers=workers == "1")
    checkpoints = ModelCheckpoint(dirpath=f"{out}/ckpt", every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
        callbacks=[checkpoints], enable_progress_bar=False, enable_model_summary=False,
    )
    ckpt = f"{out}/ckpt/epoch=0-step=3.ckpt" if phase == "load" else None
    trainer.fit(Module(out, phase), ckpt_path=ckpt)


if __name__ == "__main__":
    main(*sys.argv[1:5])
