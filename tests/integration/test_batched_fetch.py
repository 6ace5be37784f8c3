"""Whole-batch fetches (NOTE [ Vectorised fetch ], NOTE [ Batched getitem from source ]) give
exactly torch's batches, fall back sample by sample where they cannot, and raise the dataset's
own errors."""

from __future__ import annotations

import pytest
import torch
from _engine_datasets import Records
from torch.utils.data import DataLoader as TorchLoader

import stoker

EXECUTORS = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2, "timeout": 60}, id="process"),
    pytest.param({"num_workers": 2, "timeout": 60, "persistent_workers": True},
                 id="persistent"),
]


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
    torch_kwargs = {k: v for k, v in executor.items() if k != "timeout"}
    _, expected = _batches(TorchLoader, dataset, epochs=2, **torch_kwargs)
    loader, got = _batches(stoker.DataLoader, dataset, epochs=2, **executor)
    assert len(got) == len(expected) == 50
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    stats = loader.stats()
    # Two probe batches per worker (per iterator when num_workers=0) are fetched the plain way.
    probes = 2 * max(1, executor["num_workers"]) * (1 if executor.get("persistent_workers") else 2)
    assert stats.batches - probes <= stats.batched < stats.batches


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
