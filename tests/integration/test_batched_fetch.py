"""Whole-batch fetches (NOTE [ Vectorised fetch ], NOTE [ Batched getitem from source ]) give
exactly torch's batches, fall back sample by sample where they cannot, and raise the dataset's
own errors."""

from __future__ import annotations

import psutil
import pytest
import torch
from _engine_datasets import Records
from torch.utils.data import DataLoader as TorchLoader

import stoker


@pytest.fixture(autouse=True)
def _beyond_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this module tests is beyond torch (NOTE [ Same as torch unless asked ]): asked
    for through the environment, as for a script that cannot be edited."""
    monkeypatch.setenv("STOKER_BEYOND_TORCH", "batched_getitem,inline_gathers")

# worker_type="process": with "auto" these datasets would not start workers at all (NOTE
# [ Gathers need no workers ], tested below).
EXECUTORS = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2, "timeout": 60, "worker_type": "process"}, id="process"),
    pytest.param(
        {"num_workers": 2, "timeout": 60, "persistent_workers": True, "worker_type": "process"},
        id="persistent",
    ),
]
_STOKER_ONLY = ("timeout", "worker_type")


def _same(a, b):
    return (a.keys() == b.keys() and a["name"] == b["name"]
            and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in ("x", "y")))


def _batches(cls, dataset, epochs=1, **kwargs):
    gen = torch.Generator().manual_seed(5)
    loader = cls(dataset, batch_size=16, shuffle=True, generator=gen, **kwargs)
    return loader, [b for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_batched_fetch_gives_torchs_batches(executor):
    dataset = Records()
    torch_kwargs = {k: v for k, v in executor.items() if k not in _STOKER_ONLY}
    _, expected = _batches(TorchLoader, dataset, epochs=2, **torch_kwargs)
    loader, got = _batches(stoker.DataLoader, dataset, epochs=2, **executor)
    assert len(got) == len(expected) == 50
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    stats = loader.stats()
    # Two probe batches per worker (per iterator when num_workers=0) are fetched the plain way,
    # in the first epoch only: later epochs' workers trust the form an earlier one adopted.
    workers = executor["num_workers"]
    probes = 2 * workers if workers else 2
    assert stats.batched == stats.batches - probes


@pytest.mark.parametrize("executor", EXECUTORS[:2])
def test_a_batch_that_cannot_be_batched_raises_the_samples_own_error(executor):
    # Sample 300's label is NaN: int() raises for it. That batch comes after the probes, so
    # the batched form declines it and the plain path raises the dataset's error, as torch does.
    dataset = Records(bad_label=300)
    loader = stoker.DataLoader(dataset, batch_size=16, **executor)
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        for _ in loader:
            pass
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        list(TorchLoader(dataset, batch_size=16))


@pytest.mark.parametrize("executor", EXECUTORS[:2])
def test_declined_batches_are_fetched_sample_by_sample(executor):
    # A sampler yielding numpy integers: the batched form declines every batch (a numpy
    # integer index is not known to index like a Python int), and the results stay torch's.
    dataset = Records(64)
    sampler = torch.utils.data.BatchSampler(
        [torch.tensor(i).numpy()[()] for i in range(64)], batch_size=8, drop_last=False
    )
    loader = stoker.DataLoader(dataset, batch_sampler=sampler, **executor)
    expected = list(TorchLoader(dataset, batch_sampler=sampler))
    got = list(loader)
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    assert loader.stats().batched == 0


# -- NOTE [ Gathers need no workers ] ----------------------------------------------------------


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("persistent", [False, True])
def test_auto_loads_plain_gathers_in_the_calling_thread(persistent):
    dataset = Records()
    kwargs = {"num_workers": 2, "persistent_workers": persistent}
    _, expected = _batches(TorchLoader, dataset, epochs=3, **kwargs)
    loader, got = _batches(stoker.DataLoader, dataset, epochs=0, **kwargs)
    before = _children()
    got = []
    for _ in range(3):
        for batch in loader:
            got.append(batch)
            assert _children() <= before  # no worker was started (torch's may be exiting)
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    stats = loader.stats()
    # The first epoch's two probe batches are fetched sample by sample; later epochs (a new
    # iterator each unless persistent) trust the form the first one adopted.
    assert stats.inline and stats.batched == stats.batches - 2


def test_auto_keeps_workers_when_the_dataset_is_not_only_gathers():
    # A worker_init_fn could set state __getitem__ reads; process explicitly asked for.
    for kwargs in ({"worker_init_fn": _noop}, {"worker_type": "process"}):
        loader = stoker.DataLoader(Records(64), batch_size=16, num_workers=2, timeout=60, **kwargs)
        pids = set()
        for _ in loader:
            pids |= {p.pid for p in psutil.Process().children()}
        assert pids and not loader.stats().inline


def test_auto_keeps_workers_when_the_probe_batches_disagree():
    # The last index is a probe index: int(NaN) makes the batched form decline there.
    dataset = Records(64, bad_label=63)
    loader = stoker.DataLoader(dataset, batch_size=16, num_workers=2, timeout=60)
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        list(loader)
    assert not loader.stats().inline


class PairOfIndex(torch.utils.data.Dataset):
    """Its __getitem__ compiles to a batched form that gives another batch: ``[i, i * 2]``
    of a list of indices is two lists, the second repeated, not one pair per index."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i * 2])


def test_auto_keeps_workers_when_the_first_probe_batch_disagrees():
    # The probe of the second batch indexed a candidate the first had dropped (IndexError)
    kwargs = {"num_workers": 2, "timeout": 60}
    _, expected = _batches(TorchLoader, PairOfIndex(), epochs=1, **kwargs)
    loader, got = _batches(stoker.DataLoader, PairOfIndex(), epochs=1, **kwargs)
    assert [b.tolist() for b in got] == [b.tolist() for b in expected]
    assert not loader.stats().inline


def test_a_rejection_during_an_inline_epoch_sends_the_next_epoch_to_workers():
    # The loader's own probe passes, but this batch sampler yields numpy integers, which the
    # batched form declines: the epoch is fetched sample by sample (the same batches), and the
    # next one goes to workers.
    dataset = Records(64)
    sampler = torch.utils.data.BatchSampler(
        [torch.tensor(i).numpy()[()] for i in range(64)], batch_size=16, drop_last=False
    )
    loader = stoker.DataLoader(dataset, batch_sampler=sampler, num_workers=2, timeout=60)
    expected = list(TorchLoader(dataset, batch_sampler=sampler))
    before = _children()
    first = list(loader)
    assert loader.stats().inline is True and _children() <= before
    second = []
    pids: set[int] = set()
    for batch in loader:
        second.append(batch)
        pids |= _children() - before
    assert loader.stats().inline is False and pids
    assert all(_same(a, b) for a, b in zip(first + second, expected * 2, strict=True))


def _noop(worker_id: int) -> None:
    pass


def test_tensor_dataset_loads_inline_with_torchs_batches():
    # TensorDataset's own __getitem__ is a gather per tensor: no workers needed.
    dataset = torch.utils.data.TensorDataset(
        torch.randn(400, 8), torch.arange(400), torch.randint(0, 255, (400, 3), dtype=torch.uint8)
    )
    kwargs = {"num_workers": 2, "batch_size": 32, "shuffle": True}
    expected = list(TorchLoader(dataset, generator=torch.Generator().manual_seed(2), **kwargs))
    loader = stoker.DataLoader(dataset, generator=torch.Generator().manual_seed(2), **kwargs)
    before = _children()
    got = list(loader)
    assert _children() <= before
    assert len(got) == len(expected) == 13
    for a, b in zip(got, expected, strict=True):
        assert type(a) is type(b) is list
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b, strict=True))
    # Every batch gathered, the first ones too: torch's own class needs no probe batches
    # (NOTE [ torch's own datasets ]).
    assert loader.stats().inline and loader.stats().batched == 13
