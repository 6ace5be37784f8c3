"""A tiny-model ``transformers.Trainer`` on a stoker loader: train 4 steps saving at step 2,
then resume from that checkpoint (Trainer calls Accelerate's ``skip_first_batches``).

Every sample says whether it was fetched in a stoker worker (stoker's worker loop is on the
stack); the model records it per batch. Output: out/rank0.json.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info
from transformers import Trainer, TrainingArguments

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
        return {
            "x": torch.full((4,), float(i)),
            "labels": torch.tensor(float(i)),
            "engine": torch.tensor(1.0 if in_stoker_worker() else 0.0),
        }


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.seen: list[list[float]] = []

    def forward(self, x, labels, engine):  # noqa: ANN001, ANN201
        self.seen.append(engine.tolist())
        return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).mean()}


class StokerTrainer(Trainer):
    """The documented way: build stoker's loader, hand it to Accelerate as Trainer does."""

    def get_train_dataloader(self):  # noqa: ANN201
        loader = stoker.DataLoader(
            self.train_dataset, batch_size=self._train_batch_size, shuffle=True,
            num_workers=1, worker_type="process",
        )
        return self.accelerator.prepare(loader)


def train(out: str, resume: str | None) -> list[list[float]]:
    args = TrainingArguments(
        output_dir=out, max_steps=4, per_device_train_batch_size=2, save_strategy="steps",
        save_steps=2, report_to=[], use_cpu=True, logging_steps=100, disable_tqdm=True,
        save_only_model=False,
    )
    model = Tiny()
    StokerTrainer(model=model, args=args, train_dataset=Samples()).train(
        resume_from_checkpoint=resume
    )
    return model.seen


def main(out: str) -> None:
    first = train(out, None)
    resumed = train(out, f"{out}/checkpoint-2")
    with open(f"{out}/rank0.json", "w") as f:
        json.dump({"first": first, "resumed": resumed}, f)


if __name__ == "__main__":
    main(sys.argv[1])
