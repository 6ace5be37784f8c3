"""Datasets built to have one bottleneck each, and the factories `stoker doctor` runs on them
(tests/integration/test_doctor_cli.py). The differences are made large on purpose: this
machine has 2 cores and is shared, so a doctor test must not hinge on a few percent.

- storage: every sample waits 10 ms off the CPU (a real blocking wait, as a remote read);
  2 workers fetching one at a time get 200 samples/s, concurrent fetches many times that.
- cpu: every sample is ~1.5 ms of CPU in Python; one worker against a 2-core machine.
- gil: the same CPU work on 4 threads of the main process (worker_type="thread"): the GIL
  lets one run at a time; processes use both cores.
- collate: samples are plain Python lists of 2048 floats, so collate (a Python list to
  tensor conversion of the whole batch) costs ~10x the fetch; one worker.
- jpeg: real JPEG files decoded and resized by Pillow in __getitem__: the doctor names the
  decode and measures the image path on those files.
- main_thread: the cpu dataset loaded in the training thread (num_workers=0) against a
  training step about as long as loading a batch: a worker overlaps the two, which gains
  ~2x even with a single free core (the step sleeps, as a GPU step leaves the CPU idle).
- consumer_random: cheap samples drawn from ``random``, against a 100+ ms training step: the
  loop (almost) never waits; its factory returns the DataLoader itself.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch
from torch.utils.data import Dataset

_ROW = [float(k) for k in range(2048)]


class Waits(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.010)
        return torch.full((16,), float(i))


def _spin(n: int) -> float:
    acc = 0.0
    for k in range(n):
        acc += (k * 7919) % 13
    return acc


class Burns(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), _spin(20_000) + i)


class Rows(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> list[float]:
        return list(_ROW)


def rows_to_tensor(batch: list[list[float]]) -> torch.Tensor:
    return torch.tensor(batch)


class Cheap(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))


def storage() -> tuple[Any, dict[str, Any]]:
    return Waits(), {"batch_size": 8, "num_workers": 2, "worker_concurrency": 1,
                     "timeout": 60}


def cpu() -> tuple[Any, dict[str, Any]]:
    return Burns(), {"batch_size": 8, "num_workers": 1, "timeout": 60}


class LongBurns(Dataset):
    """~6 ms of Python per sample: longer than the interpreter's 5 ms GIL switch interval,
    so threads fetching at once are seen waiting for each other. Burns' ~1.3 ms fetches
    mostly finish within one turn of the GIL; their waits fall between fetches, where a
    fetch's wall time does not see them, and the verdict then hung on the few fetches cut
    by a switch (about one run in eight came out "cpu")."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), _spin(100_000) + i)


def gil() -> tuple[Any, dict[str, Any]]:
    return LongBurns(), {"batch_size": 8, "worker_type": "thread", "worker_concurrency": 4}


def collate() -> tuple[Any, dict[str, Any]]:
    return Rows(), {"batch_size": 64, "num_workers": 1, "collate_fn": rows_to_tensor,
                    "timeout": 60}


def main_thread() -> tuple[Any, dict[str, Any]]:
    return Burns(), {"batch_size": 8, "num_workers": 0}


class WaitsAndDraws(Waits):
    """Storage-bound, and augmented from the global ``random``: not thread-safe in stoker's
    sense, so the doctor must not try (or recommend) a thread opt-in for it."""

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.010)
        return torch.full((16,), float(i) + random.random())


class CheapAndDraws(Cheap):
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i) + random.random())


def storage_random() -> tuple[Any, dict[str, Any]]:
    return WaitsAndDraws(), {"batch_size": 8, "num_workers": 2, "timeout": 60}


def consumer_random() -> Any:
    """A factory that returns the loader itself (the other targets return its arguments)."""
    from stoker import DataLoader

    return DataLoader(CheapAndDraws(), batch_size=8, num_workers=2, timeout=60)


def jpeg() -> tuple[Any, dict[str, Any]]:
    """Real JPEG files decoded, cropped and resized with Pillow in __getitem__ (the demo's
    dataset, 64 files written once under the temporary directory): decode-bound."""
    import os
    import tempfile

    from stoker.doctor.demo_workload import JpegDataset, make_jpeg_files

    root = os.path.join(tempfile.gettempdir(), "stoker-doctor-test-jpeg-64")
    return JpegDataset(make_jpeg_files(root, 64)), {"batch_size": 16, "num_workers": 2,
                                                    "persistent_workers": True,
                                                    "timeout": 60}
