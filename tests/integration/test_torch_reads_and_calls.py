"""What torch's DataLoader reads from the loader and the dataset, and when: the loader under
test reads and calls the same.

- ``len(dataset)``, ``len(sampler)``, ``len(batch_sampler)``: called as often as torch calls
  them in an epoch (a dataset or sampler that logs its ``__len__`` calls sees torch's calls).
- A persistent loader's arguments set between epochs: torch's persistent iterator keeps the
  ones it was made with (its ``_reset`` reads none of them), so its next epochs run on the
  same workers with the same prefetch depth, collate_fn, worker_init_fn and seeds; only
  ``num_workers = 0`` gives a new, single-process iterator. ``batch_size`` is refused.

Each test runs torch's loader and the loader under test and compares what they did.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    SequentialSampler,
    get_worker_info,
)

N = 6


# -- len() calls -------------------------------------------------------------------------------


class LenLoggingDS(Dataset):
    """Counts its ``__len__`` calls in the main process (a worker's copy counts its own)."""

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self.calls = 0

    def __len__(self) -> int:
        self.calls += 1
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class LenLoggingBatchSampler(BatchSampler):
    calls = 0

    def __len__(self) -> int:
        type(self).calls += 1
        return super().__len__()


def _len_calls(loader_cls: type, kind: str, num_workers: int) -> tuple[int, int, list[Any]]:
    ds = LenLoggingDS()
    kw: dict[str, Any] = dict(num_workers=num_workers)
    if num_workers:
        kw["timeout"] = 30.0
    LenLoggingBatchSampler.calls = 0
    if kind == "batch_sampler":
        kw["batch_sampler"] = LenLoggingBatchSampler(SequentialSampler(ds), 2, False)
    elif kind == "shuffle":
        kw.update(batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
    elif kind == "no_batching":
        kw["batch_size"] = None
    else:
        kw["batch_size"] = 2
    loader = loader_cls(ds, **kw)
    batches = [_plain(b) for b in loader]
    batches += [_plain(b) for b in list(loader)]  # list() asks len(loader) first
    return ds.calls, LenLoggingBatchSampler.calls, batches


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["batch_size", "shuffle", "no_batching", "batch_sampler"])
def test_len_is_called_as_often_as_torch_calls_it(Loader, TorchLoader, kind, num_workers):
    expected = _len_calls(TorchLoader, kind, num_workers)
    assert _len_calls(Loader, kind, num_workers) == expected


# -- a persistent loader's arguments set between epochs ----------------------------------------


def _worker() -> int:
    info = get_worker_info()
    return -1 if info is None else info.id


class ShardedIter(IterableDataset):
    """Each worker yields its share; a sample says which worker read it and its seed's draw."""

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, N, nw):
            yield [i, wid, int(torch.randint(0, 1 << 30, ()))]


class MapWithWorker(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> list[int]:
        return [i, _worker(), int(torch.randint(0, 1 << 30, ()))]


def seed_from_id(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)


def list_collate(samples: list[Any]) -> list[Any]:
    return ["listed", samples]


SETTINGS = {
    "num_workers_1": [("num_workers", 1)],
    "num_workers_5": [("num_workers", 5)],
    "num_workers_0": [("num_workers", 0), ("timeout", 0)],
    "others": [
        ("prefetch_factor", 1), ("timeout", 7.0), ("pin_memory", True),
        ("worker_init_fn", seed_from_id), ("collate_fn", list_collate),
        ("generator", torch.Generator().manual_seed(99)), ("in_order", False),
    ],
    "batch_size": [("batch_size", 3)],
}


def _two_epochs(loader_cls: type, kind: str, setting: str) -> list[Any]:
    ds = ShardedIter() if kind == "iter" else MapWithWorker()
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(0)  # num_workers=0 draws from the global RNG in this process
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than CPUs here, pin_memory without CUDA
        loader = loader_cls(ds, batch_size=2, num_workers=3, persistent_workers=True,
                            timeout=30.0, generator=gen, shuffle=(kind == "map") or None)
        out: list[Any] = [[_plain(b) for b in loader]]
        for name, value in SETTINGS[setting]:
            try:
                setattr(loader, name, value)
            except Exception as exc:
                out.append((name, type(exc).__name__, str(exc)))
        out.append([_plain(b) for b in loader])
        out.append([_plain(b) for b in loader])  # and the epoch after
    return out


def _plain(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, (list, tuple)):
        return [_plain(x) for x in batch]
    return batch


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("kind", ["iter", "map"])
def test_a_persistent_loader_keeps_its_iterators_arguments_as_torch_does(
    Loader, TorchLoader, kind, setting
):
    expected = _two_epochs(TorchLoader, kind, setting)
    assert _two_epochs(Loader, kind, setting) == expected
