"""Datasets of ``test_option_combinations``: each sample carries its index where
``indices_of`` finds it back from a batch, whatever the batching. Module-level, so that
spawn workers import them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info


class Pairs(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i * 2])  # a compiled batched form of this disagrees


class Rows(Dataset):
    """Plain gathers of an array (what ``inline_gathers`` and ``batched_getitem`` adopt)."""

    def __init__(self, n: int) -> None:
        self.x = np.arange(n * 3).reshape(n, 3)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.x[i]


class Records(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"i": i, "t": torch.full((2,), float(i)), "s": str(i)}


class Failing(Pairs):
    """Sample 5 raises: ``on_error="skip"`` leaves it out."""

    bad = 5

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise ValueError(f"bad sample {i}")
        return torch.tensor([i, 0])


class Stream(IterableDataset):
    """Shards itself across workers, as torch's docs show."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        k, m = (info.id, info.num_workers) if info else (0, 1)
        return iter(torch.tensor([i, 0]) for i in range(k, self.n, m))


def make(kind: str, n: int) -> Any:
    return {
        "list": lambda: list(range(n)), "pairs": lambda: Pairs(n), "rows": lambda: Rows(n),
        "tensors": lambda: TensorDataset(torch.arange(n), torch.arange(n) * 2),
        "records": lambda: Records(n), "stream": lambda: Stream(n),
        "failing": lambda: Failing(n),
    }[kind]()


def indices_of(kind: str, batch: Any) -> list[int]:
    """The sample indices in a batch of ``make(kind, n)``."""
    if kind == "records":
        value = batch["i"]
        return value.tolist() if torch.is_tensor(value) and value.dim() else [int(value)]
    if kind == "tensors":
        return batch[0].tolist() if batch[0].dim() else [int(batch[0])]
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    if kind == "list":
        return batch.tolist() if torch.is_tensor(batch) and batch.dim() else [int(batch)]
    column = batch[..., 0] // (3 if kind == "rows" else 1)
    return column.tolist() if column.dim() else [int(column)]


def wif(worker_id: int) -> None:
    np.random.seed(worker_id)


def stack(batch: Any) -> torch.Tensor:
    return torch.stack([torch.as_tensor(b) for b in batch])
