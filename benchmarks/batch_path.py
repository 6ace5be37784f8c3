"""Which stoker modules one steady-state batch passes through (issue 35's "one batch crosses
26 modules"), in the main process and in a worker.

    .venv/bin/python benchmarks/batch_path.py

A map-style ``TensorDataset``, ``num_workers=2``, batch 64, the defaults. The main process
records every stoker function called inside ``next()`` for batches 20-40 (``sys.setprofile``);
each worker records the stoker functions it calls once it has served 20 tasks, until it has
served 40, and writes the modules it saw to a file. Printed: the modules of each side, the
calls per batch, and their union. A count, not a time: run it anywhere.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import stoker

ROOT = str(Path(stoker.__file__).parent)
FIRST, LAST = 20, 40


def _module(filename: str) -> str | None:
    if not filename.startswith(ROOT):
        return None
    rel = Path(filename).relative_to(ROOT).with_suffix("")
    return ".".join(("stoker", *rel.parts)).removesuffix(".__init__")


class _Recorder:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            module = _module(frame.f_code.co_filename)
            if module is not None:
                self.calls[module] += 1


def _in_worker(out_dir: str) -> Any:
    """A worker_init_fn: record the worker's calls between its FIRST-th and LAST-th task."""
    def init(worker_id: int) -> None:
        recorder = _Recorder()
        seen = {"tasks": 0}
        inner = stoker.get_worker_info().dataset  # type: ignore[union-attr]
        get = type(inner).__getitem__

        class Counting(type(inner)):  # type: ignore[misc]
            def __getitem__(self, i: Any) -> Any:
                if i % 64 == 0:  # a batch's first sample: a new task
                    seen["tasks"] += 1
                    if seen["tasks"] == FIRST:
                        sys.setprofile(recorder)
                    elif seen["tasks"] == LAST:
                        sys.setprofile(None)
                        Path(out_dir, f"worker{worker_id}.json").write_text(
                            json.dumps(dict(recorder.calls)))
                return get(self, i)

        inner.__class__ = Counting
    return init


def trace() -> tuple[Counter[str], Counter[str], int]:
    """Calls per stoker module: in the main process over batches FIRST-LAST, in the workers
    over their tasks FIRST-LAST (summed), and the number of batches each side counts."""
    dataset = torch.utils.data.TensorDataset(torch.randn(64 * 100, 8), torch.arange(64 * 100))
    with tempfile.TemporaryDirectory() as out:
        loader = stoker.DataLoader(dataset, batch_size=64, num_workers=2,
                                   worker_init_fn=_in_worker(out))
        main_side = _Recorder()
        it = iter(loader)
        for k in range(2 * LAST + 10):  # each of the 2 workers serves LAST tasks
            if k == FIRST:
                sys.setprofile(main_side)
            elif k == LAST:
                sys.setprofile(None)
            next(it)
        it._shutdown_workers()  # type: ignore[attr-defined]
        del it
        workers = [Counter(json.loads(p.read_text())) for p in sorted(Path(out).iterdir())]
    return main_side.calls, sum(workers, Counter()), LAST - FIRST


def main() -> None:
    main_calls, worker_side, batches = trace()
    print(f"main process, per next() (batches {FIRST}-{LAST}): "
          f"{len(main_calls)} modules, {sum(main_calls.values()) / batches:.0f} calls")
    for name, calls in sorted(main_calls.items()):
        print(f"  {name:45s} {calls / batches:6.1f}")
    tasks = batches * 2  # each worker served LAST - FIRST tasks
    print(f"worker, per task: {len(worker_side)} modules, "
          f"{sum(worker_side.values()) / max(tasks, 1):.0f} calls")
    for name, calls in sorted(worker_side.items()):
        print(f"  {name:45s} {calls / max(tasks, 1):6.1f}")
    both = set(main_calls) | set(worker_side)
    print(f"together: {len(both)} stoker modules")
    print(json.dumps({"main": sorted(main_calls), "worker": sorted(worker_side),
                      "together": len(both), "pid": os.getpid()}))


if __name__ == "__main__":
    main()
