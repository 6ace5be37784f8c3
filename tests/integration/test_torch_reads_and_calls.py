"""What torch's DataLoader reads from the loader and the dataset, and when: the loader under
test reads and calls the same.

- ``len(dataset)``, ``len(sampler)``, ``len(batch_sampler)``: called as often as torch calls
  them in an epoch (a dataset or sampler that logs its ``__len__`` calls sees torch's calls).
- A class or function of torch's that the program patched (``functools.wraps`` wrappers, the
  usual way): the samplers' methods, ``TensorDataset.__getitem__``, ``default_collate`` and
  ``collate_tensor_fn`` rebound in their module: torch calls the program's version, and so
  does the loader under test (its fast paths are only for torch's own code).
- A persistent loader's arguments set between epochs: torch's persistent iterator keeps the
  ones it was made with (its ``_reset`` reads none of them), so its next epochs run on the
  same workers with the same prefetch depth, collate_fn, worker_init_fn and seeds; only
  ``num_workers = 0`` gives a new, single-process iterator. ``batch_size`` is refused.

Each test runs torch's loader and the loader under test and compares what they did.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    get_worker_info,
)
from torch.utils.data._utils import collate as torch_collate

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


# -- torch's code, patched by the program --------------------------------------------------------


def _reversed_iter(stock: Any) -> Any:
    @functools.wraps(stock)
    def __iter__(self: Any) -> Any:
        yield from reversed(list(stock(self)))
    return __iter__


def _plus_1000(stock: Any) -> Any:
    @functools.wraps(stock)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = stock(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return out + 1000
        if isinstance(out, tuple):
            return tuple(t + 1000 if t.is_floating_point() else t for t in out)
        if isinstance(out, list):
            return [t + 1000 if t.is_floating_point() else t for t in out]
        return out
    return wrapper


_PATCHES = {
    "RandomSampler.__iter__": (RandomSampler, "__iter__", _reversed_iter),
    "SequentialSampler.__iter__": (SequentialSampler, "__iter__", _reversed_iter),
    "BatchSampler.__iter__": (BatchSampler, "__iter__", _reversed_iter),
    "TensorDataset.__getitem__": (TensorDataset, "__getitem__", _plus_1000),
    "default_collate": (torch_collate, "default_collate", _plus_1000),
}


def _batches(Loader: type, shuffle: bool, num_workers: int) -> list:
    gen = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(24, 2, generator=gen), torch.arange(24))
    loader = Loader(ds, batch_size=5, shuffle=shuffle, num_workers=num_workers,
                    generator=torch.Generator().manual_seed(1), timeout=60 if num_workers else 0)
    return [[t.tolist() for t in batch] for batch in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("patched", [*_PATCHES, "collate_tensor_fn"])
def test_torchs_code_the_program_patched_is_called(
        Loader, TorchLoader, monkeypatch, patched, num_workers):
    shuffle = patched != "SequentialSampler.__iter__"
    with monkeypatch.context() as patch:
        if patched == "collate_tensor_fn":
            # rebound in its module and put in the map: the map holds what the module says
            wrapper = _plus_1000(torch_collate.collate_tensor_fn)
            patch.setattr(torch_collate, "collate_tensor_fn", wrapper)
            patch.setitem(torch_collate.default_collate_fn_map, torch.Tensor, wrapper)
        else:
            owner, name, make = _PATCHES[patched]
            patch.setattr(owner, name, make(getattr(owner, name)))
        expected = _batches(TorchLoader, shuffle, num_workers)
        got = _batches(Loader, shuffle, num_workers)
    assert expected != _batches(TorchLoader, shuffle, num_workers)  # the patch showed
    assert got == expected
