"""An IterableDataset whose state changes inside persistent workers is saved from the workers
(NOTE [ Worker streams resume ] in ``stoker.engine.worker_streams``).

torchdata's ``TestMultiEpochState::test_pw``: a dataset that counts its epochs in ``__iter__``
(the count lives in each worker's copy; the main process's copy never iterates) must resume
with the workers' count, not the main process's. Before, stoker saved the main process's copy
and the resumed epochs silently repeated the first epoch's data.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import stoker

SIZES = [5, 8, 3, 6]  # per worker: streams that end at different times


class EpochCounting(tud.IterableDataset):
    """torchdata's ``GeneratorIterable(..., increment_epoch=True)``: worker w yields
    ``(i, epoch)`` for its own range, skipping what a loaded state says it delivered; the
    epoch count goes up at the end of each pass."""

    def __init__(self) -> None:
        self.i, self.epoch, self.resume = 0, 0, None

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        w = info.id if info is not None else 0
        sizes = SIZES if info is not None else [sum(SIZES)]
        self.i = 0
        if self.resume is not None:
            self.i, self.resume = self.resume, None
        start = sum(sizes[:w])
        for i in range(start + self.i, start + sizes[w]):
            self.i += 1
            yield (i, self.epoch)
        self.i = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume = state["i"]
        self.epoch = state["epoch"]


def _loader(**kwargs: Any) -> stoker.DataLoader:
    return stoker.DataLoader(EpochCounting(), num_workers=len(SIZES), persistent_workers=True,
                             collate_fn=lambda batch: batch, seeding="per_worker", timeout=60,
                             **kwargs)


def _quiet(loader: Any) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fast-forward's one-time warning
        return list(loader)


def test_state_after_an_epoch_has_the_workers_epoch_count() -> None:
    """torchdata's test_pw, with stoker.DataLoader."""
    dl = _loader()
    exp0 = list(dl)
    state1 = dl.state_dict()
    exp1 = list(dl)
    exp2 = list(dl)
    assert exp0 == [[(x[0][0], x[0][1] - 1)] for x in exp1]
    assert exp0 == [[(x[0][0], x[0][1] - 2)] for x in exp2]

    dl = _loader()
    it = iter(dl)
    for _ in range(2):
        next(it)
    dl.load_state_dict(state1)
    data1 = list(iter(dl))
    data2 = list(dl)
    assert data1 == exp1
    assert data2 == exp2


@pytest.mark.parametrize("at", [0, 3, 11])
def test_mid_epoch_state_of_a_later_epoch(at: int) -> None:
    dl = _loader()
    list(dl)
    it = iter(dl)
    head = [next(it) for _ in range(at)]
    state = dl.state_dict()
    rest = list(it)
    later = list(dl)
    assert all(item[0][1] == 1 for item in head + rest) and rest

    again = _loader()
    again.load_state_dict(state)
    assert head + _quiet(again) == head + rest
    assert list(again) == later


def test_state_keys_stay_the_same() -> None:
    """NOTE [ Constant state keys ]: the workers' states are a list from the start."""
    dl = _loader()
    fresh = dl.state_dict()
    list(dl)
    after = dl.state_dict()
    assert fresh["worker_dataset_states"] == [{"i": 0, "epoch": 0}] * len(SIZES)
    assert after["worker_dataset_states"] == [{"i": 0, "epoch": 1}] * len(SIZES)
    assert fresh.keys() == after.keys()


class WithTensorState(EpochCounting):
    """A state holding a tensor (torchdata's DummyIterator keeps torch.get_rng_state())."""

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch_t": torch.tensor([self.epoch])}


def test_a_tensor_in_a_workers_state_comes_back_as_a_copy() -> None:
    dl = stoker.DataLoader(WithTensorState(), num_workers=2, persistent_workers=True,
                           collate_fn=lambda batch: batch, seeding="per_worker", timeout=60)
    list(dl)
    states = dl.state_dict()["worker_dataset_states"]
    assert [s["epoch_t"].tolist() for s in states] == [[1], [1]]
    assert not any(s["epoch_t"].is_shared() for s in states)
