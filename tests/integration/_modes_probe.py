"""What the program's torch modes and its profiler see of a loader, under one loader in a fresh
interpreter. Run as::

    STOKER_PROBE_LOADER=torch|stoker python _modes_probe.py plain|tensor NUM_WORKERS \
        shuffle|ordered OUT_DIR

and it prints one JSON object: the functions a logging ``TorchFunctionMode`` and the operators
a ``TorchDispatchMode`` saw on the main thread while the loop ran, the functions the mode saw in
each worker (forked while it was active) by the last ``__getitem__`` there, the loader's ranges
in a ``torch.profiler`` trace, and the batches. ``test_torch_modes_as_torch.py`` compares them.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import torch
import torch.utils.data

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from _counting_modes import counting_mode  # noqa: E402

if os.environ["STOKER_PROBE_LOADER"] == "stoker":
    from stoker import DataLoader
else:
    from torch.utils.data import DataLoader

MAIN_PID = os.getpid()
KIND, NUM_WORKERS, ORDER, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


calls = counting_mode("function")
PASS = "calls"  # workers forked in this pass (its value then) write what their mode saw


class Plain(torch.utils.data.Dataset):
    """Tensor rows and numpy labels, as many datasets return them."""

    def __init__(self) -> None:
        self.x = torch.arange(60 * 3, dtype=torch.float32).reshape(60, 3)
        self.y = np.arange(60)

    def __len__(self) -> int:
        return 60

    def __getitem__(self, i: int) -> Any:
        if os.getpid() != MAIN_PID and PASS == "calls":  # what the mode it was forked with saw
            info = torch.utils.data.get_worker_info()
            with open(os.path.join(OUT, f"worker{info.id}.json"), "w") as f:
                json.dump(dict(calls.seen), f)
        return self.x[i], self.y[i]


def dataset() -> Any:
    if KIND == "plain":
        return Plain()
    return torch.utils.data.TensorDataset(torch.arange(60 * 3).reshape(60, 3), torch.arange(60))


def run(loader: Any) -> list:
    return [[t.tolist() for t in batch] for batch in loader]


torch.manual_seed(0)
loader = DataLoader(dataset(), batch_size=8, num_workers=NUM_WORKERS,
                    shuffle=ORDER == "shuffle")
ops = counting_mode("dispatch")
with calls:
    batches = run(loader)
PASS = "ops"
with ops:
    run(loader)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    run(loader)
ranges = {e.key: e.count for e in prof.key_averages()
          if "DataLoader" in e.key or "stoker" in e.key}
workers = {}
for name in sorted(os.listdir(OUT)):
    with open(os.path.join(OUT, name)) as f:
        workers[name] = json.load(f)
print(json.dumps({"calls": dict(calls.seen), "ops": dict(ops.seen), "workers": workers,
                  "ranges": ranges, "batches": batches}, sort_keys=True))
