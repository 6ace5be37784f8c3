"""Under ``torchrun --nproc_per_node 2`` (gloo, CPU): Accelerate's stateful resume
(``DataLoaderConfiguration(use_stateful_dataloader=True)``, ``accelerator.save_state()`` /
``load_state()``) of a stoker loader, in two runs of this script:
``accelerate_resume_run.py OUT PHASE CLASS`` with PHASE ``save`` (the whole epoch, saving after
``SAVE_AFTER`` batches; ``save-main``: ``save_state()`` on the main process alone) or ``load``
(a new process: load, then the rest of the epoch), CLASS
``DataLoader`` or ``StatefulDataLoader`` (stoker's), or PHASE ``epochs``: two epochs of CLASS
``torch`` (Accelerate builds torchdata's loader over torch's) or ``stoker``. The ranks' global
RNGs are seeded apart, so each rank draws its own base seed, and every sample carries a draw of
its worker's stream: a rank resumed with another rank's seeds would show it. Accelerate has
every rank write one shared ``dl_state_dict.bin`` and load it. Each rank writes
``OUT/<PHASE>_rank<r>.json`` (``OUT/<CLASS>_rank<r>.json`` for ``epochs``).
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import Dataset

import stoker

N, BATCH, SAVE_AFTER = 24, 2, 3


class Draws(Dataset):
    """Sample ``i`` is ``[i, a draw from the fetching worker's torch stream]``."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, int(torch.randint(0, 2**30, ()))])


def epochs(out: str, accelerator: Accelerator, cls: str) -> None:
    """Two epochs, as the same script gives them with torchdata's loader under Accelerate."""
    torch.manual_seed(100 + accelerator.process_index)
    make = torch.utils.data.DataLoader if cls == "torch" else stoker.DataLoader
    prepared = accelerator.prepare(make(Draws(), batch_size=BATCH, shuffle=True, num_workers=2,
                                        timeout=60))
    record = {"epochs": [[b.tolist() for b in prepared] for _ in range(2)],
              "base": type(prepared.base_dataloader).__qualname__}
    with open(f"{out}/{cls}_rank{accelerator.process_index}.json", "w") as f:
        json.dump(record, f)


def main(out: str, phase: str, cls: str) -> None:
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    rank = accelerator.process_index
    if phase == "epochs":
        epochs(out, accelerator, cls)
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return
    torch.manual_seed(100 + rank)  # as the script seeds, in both runs
    loader = getattr(stoker, cls)(Draws(), batch_size=BATCH, shuffle=True, num_workers=2,
                                  timeout=60)
    prepared = accelerator.prepare(loader)
    batches: list[list[list[int]]] = []
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        if phase == "load":
            accelerator.load_state(f"{out}/ckpt")
        for batch in prepared:
            batches.append(batch.tolist())
            if phase.startswith("save") and len(batches) == SAVE_AFTER and (
                    phase == "save" or accelerator.is_main_process):
                accelerator.save_state(f"{out}/ckpt")
    record = {"rank": rank, "batches": batches,
              "base": type(prepared.base_dataloader).__qualname__,
              "warned": [str(w.message) for w in told if "stoker" in w.filename
                         or "load_state_dict" in str(w.message)]}
    with open(f"{out}/{phase}_rank{rank}.json", "w") as f:
        json.dump(record, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:4])
