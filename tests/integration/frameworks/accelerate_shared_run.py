"""One CPU process: Accelerate rebuilds each loader as the loader it was (NOTE [ Accelerate keeps
stoker ]), also when loaders share one dataset: a loader the user built with torch stays
torch's, and each stoker loader keeps its own arguments.
``python accelerate_shared_run.py OUT BINDING``: BINDING ``accelerator`` calls
``accelerator.prepare`` and ``accelerate.skip_first_batches`` after ``import stoker``;
``bound-before`` calls ``prepare_data_loader`` / ``skip_first_batches`` imported from
``accelerate.data_loader`` *before* ``import stoker`` (functions stoker never wrapped).
Writes ``OUT/rank0.json``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.data_loader import prepare_data_loader as bound_prepare
from accelerate.data_loader import skip_first_batches as bound_skip
from torch.utils.data import Dataset

import stoker  # after the two bindings above: stoker wraps neither

N, BAD = 8, 3


class Flaky(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        if i == BAD:
            raise ValueError(f"bad sample {i}")
        return i


def outcome(loader: Any) -> dict[str, Any]:
    """What the prepared loader is built on, and what iterating it gives."""
    base = loader.base_dataloader if hasattr(loader, "base_dataloader") else loader
    result: dict[str, Any] = {
        "base": f"{type(base).__module__}.{type(base).__qualname__}",
        "on_error": getattr(base, "on_error", None),
        "stall_warning_s": getattr(base, "stall_warning_s", None),
    }
    batches: list[list[int]] = []
    try:
        for batch in loader:
            batches.append(batch.tolist())
    except Exception as exc:  # noqa: BLE001 (recorded, the test compares)
        result["raised"] = f"{type(exc).__name__}: {exc}"
    result["batches"] = batches
    return result


def main(out: str, binding: str) -> None:
    accelerator = Accelerator(cpu=True)
    prepare = accelerator.prepare if binding == "accelerator" else bound_prepare
    skip = skip_first_batches if binding == "accelerator" else bound_skip
    dataset = Flaky()
    loaders = {
        "torch": torch.utils.data.DataLoader(dataset, batch_size=2),
        "stoker_raise": stoker.DataLoader(dataset, batch_size=2, stall_warning_s=7.0),
        # Built last: the loader a lookup by dataset alone would find for all three.
        "stoker_skip": stoker.DataLoader(dataset, batch_size=2, on_error="skip",
                                         skip_budget=1),
    }
    record: dict[str, Any] = {}
    for name, loader in loaders.items():
        prepared = prepare(loader)
        record[name] = outcome(prepared)
        record[f"{name}, skip 1"] = outcome(skip(prepared, 1))
    with open(f"{out}/rank0.json", "w") as f:
        json.dump(record, f)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
