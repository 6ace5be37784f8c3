"""The modules a program finds loaded (``sys.modules``) after one loader's pass, in the main
process and in a worker, under one loader in a fresh interpreter. Run as::

    STOKER_PROBE_LOADER=torch|stoker python _modules_probe.py NUM_WORKERS START_METHOD OUT

and it prints one JSON object: the modules loaded since the loader's import (stoker's own
left out), in the main process and in worker 0 (read in ``__getitem__``).
``tests/integration/test_modules_as_torch.py`` compares the two outputs."""

from __future__ import annotations

import json
import os
import sys

import numpy  # noqa: F401  (torch loads it too: the baseline holds it)
import torch
import torch.utils.data

LOADER, NUM_WORKERS, METHOD, OUT = (os.environ["STOKER_PROBE_LOADER"], int(sys.argv[1]),
                                    sys.argv[2], sys.argv[3])
BEFORE = set(sys.modules)


def _new(names: set[str]) -> list[str]:
    return sorted(n for n in names - BEFORE if not n.startswith("stoker"))


class Recording(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        info = torch.utils.data.get_worker_info()
        path = os.path.join(OUT, f"worker{info.id}.json") if info is not None else None
        if path is not None and not os.path.exists(path):
            with open(path, "w") as f:
                json.dump(_new(set(sys.modules)), f)
        return i


def main() -> None:
    if LOADER == "stoker":
        import stoker

        cls = stoker.DataLoader
    else:
        cls = torch.utils.data.DataLoader
    kwargs = {"multiprocessing_context": METHOD} if NUM_WORKERS else {}
    loader = cls(Recording(), batch_size=2, num_workers=NUM_WORKERS, **kwargs)
    batches = [b.tolist() for b in loader]
    worker = os.path.join(OUT, "worker0.json")
    print(json.dumps({
        "batches": batches, "main": _new(set(sys.modules)),
        "worker": json.load(open(worker)) if os.path.exists(worker) else None,
    }))


if __name__ == "__main__":
    main()
