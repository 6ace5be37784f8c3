"""Lightning's ``seed_everything(workers=True)`` gives a loader ``worker_init_fn =
partial(pl_worker_init_function, rank=...)``, which reseeds the global RNGs in each worker.
A resume still continues each worker's streams (NOTE [ Worker streams resume ]), and what
stoker says about it names Lightning and its switch, not the user's worker_init_fn."""

from __future__ import annotations

import functools
import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from _launch import need
from torch.utils.data import Dataset

import stoker
from stoker.testing import assert_resumes_exactly

N = 13


class Augmented(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"index": i, "py": random.random(), "np": np.random.rand(), "torch": torch.rand(2)}


def _lightning_loader(num_workers: int = 2, **kwargs: Any) -> stoker.DataLoader:
    """A loader as Lightning's trainer leaves it after seed_everything(7, workers=True)."""
    from lightning.fabric.utilities.data import _auto_add_worker_init_fn

    loader = stoker.DataLoader(Augmented(), batch_size=3, shuffle=True, num_workers=num_workers,
                               generator=torch.Generator().manual_seed(3), timeout=60,
                               **kwargs)
    _auto_add_worker_init_fn(loader, rank=0)
    assert isinstance(loader.worker_init_fn, functools.partial)
    return loader


@pytest.fixture
def seed_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    need("lightning")
    monkeypatch.setenv("PL_SEED_WORKERS", "1")  # what seed_everything(workers=True) sets


def test_per_worker_seeding_resumes_exactly(seed_workers: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: torch's seeding, Lightning's seeds
        assert_resumes_exactly(
            functools.partial(_lightning_loader, seeding="per_worker"), steps=4)


_TOLD = (
    "Lightning's seed_everything(workers=True) gave this loader a worker_init_fn "
    "(pl_worker_init_function) that seeds the global RNGs (random, numpy, torch) in each worker, "
    "so stoker leaves them to it: each worker draws from its own stream, as with torch, the "
    "augmentations depend on num_workers, and a saved state resumes only with the same "
    "num_workers. seeding=\"per_batch\" already gives every batch its own seeded streams, the "
    "same for any num_workers; to have that, call seed_everything(seed, workers=False). To keep "
    "Lightning's per-worker seeding without this warning, pass seeding=\"per_worker\"."
)


def test_per_batch_seeding_names_lightning(seed_workers: None) -> None:
    make = functools.partial(_lightning_loader, seeding="per_batch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_resumes_exactly(make, steps=4)  # its workers' own streams continue
    told = {str(w.message) for w in caught if "worker_init_fn" in str(w.message)}
    assert told == {_TOLD}

    loader = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(loader)
        next(it)
    state = loader.state_dict()
    del it
    assert state["worker_seeding"] == "lightning_worker_init_fn"
    with pytest.raises(ValueError) as info:
        _lightning_loader(num_workers=3, seeding="per_batch").load_state_dict(state)
    assert str(info.value) == (
        "load_state_dict: this state was saved with num_workers=2, and Lightning's "
        "seed_everything(workers=True) gave the loader a worker_init_fn "
        "(pl_worker_init_function) that seeds the global RNGs in each worker: each worker "
        "draws its random numbers from its own streams, so the rest of the epoch depends on "
        "which worker loads which batch and cannot be drawn by num_workers=3. Load it into a "
        "loader with num_workers=2, or call seed_everything(seed, workers=False): "
        "seeding=\"per_batch\" then seeds every batch from its position, and its states resume "
        "at any num_workers."
    )
