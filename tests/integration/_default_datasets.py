"""Ordinary datasets, correct under torch's DataLoader, that stoker's defaults once ran
differently (issue 30). Module level so that workers can unpickle them."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Arrays(Dataset):
    """Plain array gathers: the kind stoker's inline path took over."""

    def __init__(self, n: int = 64) -> None:
        self.x = np.arange(n, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.x[i]


def add_hundred(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    info.dataset.x = info.dataset.x + 100


def where_collated(samples: list) -> tuple:
    """Collates, and says whether it ran in a worker."""
    return torch.utils.data.default_collate(samples), get_worker_info() is not None


class Seeds(Dataset):
    """What a sample can see of its seeding: torch's initial seed, the worker's seed and id, and
    one draw from each global RNG."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple:
        info = get_worker_info()
        return (
            torch.initial_seed(),
            -1 if info is None else info.seed,
            -1 if info is None else info.id,
            random.random(),
            float(np.random.rand()),
            torch.rand(()).item(),
        )


class ShuffledShards(IterableDataset):
    """Shards shuffled with ``random`` inside ``__iter__``, split by worker."""

    def __init__(self, shards: int = 12, per_shard: int = 3) -> None:
        self.shards, self.per_shard = shards, per_shard

    def __iter__(self):
        info = get_worker_info()
        order = list(range(self.shards))
        random.shuffle(order)
        mine = order if info is None else order[info.id::info.num_workers]
        for shard in mine:
            for k in range(self.per_shard):
                yield shard * 100 + k


class Noisy(Dataset):
    """Draws from torch's global RNG in ``__getitem__`` (a random augmentation)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(2) + i


class Paths(Dataset):
    """A large list of plain strings (ImageFolder's samples), and a type check on it."""

    def __init__(self, n: int = 70_000) -> None:
        self.samples = [f"img/{i:06d}.jpg" for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple:
        return self.samples[i], isinstance(self.samples, list), type(self.samples).__name__


class WhoLoads(Dataset):
    """Reports which worker loaded each sample; sample 0 computes for ``straggle_cpu_s`` of
    CPU time first (a straggler batch that keeps its worker busy, as a hard sample does)."""

    def __init__(self, straggle_cpu_s: float = 0.0) -> None:
        self.straggle_cpu_s = straggle_cpu_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple:
        if i == 0:
            start, x = time.thread_time(), 0
            while time.thread_time() - start < self.straggle_cpu_s:
                x += sum(range(1000))
        info = get_worker_info()
        return i, -1 if info is None else info.id


class CountingSampler(torch.utils.data.Sampler):
    """Counts its passes in ``__iter__``, a plain function: ``iter()`` runs it at once."""

    def __init__(self, n: int) -> None:
        self.n, self.passes = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # noqa: ANN204
        self.passes += 1
        return iter(range(self.n))


class CountingBatchSampler(CountingSampler):
    """Batches of two, passes counted in a plain ``__iter__``."""

    def __iter__(self):  # noqa: ANN204
        self.passes += 1
        return iter([[i, i + 1] for i in range(0, self.n, 2)])


class ReadsSampler(torch.utils.data.Dataset):
    """Each sample: its index, the sampler's pass count and a draw from numpy's global RNG."""

    def __init__(self, sampler: Any, n: int = 4) -> None:
        self.sampler, self.n = sampler, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple:
        return i, getattr(self.sampler, "passes", -1), float(np.random.rand())


class CtrlCAtThird(torch.utils.data.Dataset):
    """A Ctrl-C reaches the worker loading sample 2 (SIGINT to itself): it ends quietly, exit
    code 0, after sending the batches before it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return i


class BatchesByKey(torch.utils.data.Dataset):
    """Whole batches by key: the batch sampler yields one key per batch (a shard id, not a
    list of indices), which torch hands to ``__getitems__`` as it is; records its type."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("batches are read whole")

    def __getitems__(self, key: Any) -> list:
        return [type(key).__name__, repr(key)]


class DrawsWhenPickled(torch.utils.data.Dataset):
    """Gives each spawned worker's copy a seed of its own, drawn from the global torch RNG as
    it is pickled (in the main process, one draw per worker started)."""

    def __init__(self) -> None:
        self.seed = -1

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> list[int]:
        return [i, self.seed]

    def __getstate__(self) -> dict[str, Any]:
        self.seed = int(torch.randint(0, 2**31, (1,)))
        return self.__dict__
