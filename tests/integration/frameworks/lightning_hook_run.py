"""Lightning (CPU, 2 processes, ``ddp``, gloo) building a stoker loader INSIDE the
``train_dataloader`` hook, with ``import stoker`` run there for the first time:
``python lightning_hook_run.py OUT``. Lightning runs the hook with ``DataLoader.__init__`` of
every subclass then defined wrapped to record its arguments; ``stoker.DataLoader`` is defined
after that, so only torch's ``__init__`` records them, as stoker's ``__init__`` passes them.
Lightning then rebuilds the loader from that record with its injected ``DistributedSampler``
(``_update_dataloader``). Each rank writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
import traceback

import lightning as L
import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

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
        self.stoker_imported_first_in_hook: bool | None = None

    def train_dataloader(self):  # noqa: ANN201
        self.stoker_imported_first_in_hook = "stoker" not in sys.modules
        import stoker

        return stoker.DataLoader(Samples(), batch_size=2, shuffle=True, num_workers=1)

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
            "engine": self.engine, "first_import": self.stoker_imported_first_in_hook,
            "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
            "sampler": type(loader.sampler).__qualname__, "batches": loader.stats().batches,
        }
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as f:
            json.dump(record, f)


def main(out: str) -> None:
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Module(out))


if __name__ == "__main__":
    main(sys.argv[1])
