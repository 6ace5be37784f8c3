"""``stoker.StatefulDataLoader`` against the real ``torchdata`` ``StatefulDataLoader``.

Both loaders run the same dataset with the same arguments; a state is taken at a save point
(right after ``iter()``, after some batches, at the end of an epoch, in the second epoch),
loaded into a fresh loader of the same kind, and what the fresh loader yields from there
(to the end of a second epoch) must be the same for both. ``__iter__`` of the dataset: stoker
calls it once per epoch, never more than torchdata does.

Where stoker deliberately differs, the test says so (see docs/from_torchdata.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _launch import need
from torch.utils.data import Dataset, IterableDataset

import stoker

N = 10
EPOCHS = 2


class Stream(IterableDataset):
    """torchdata's pattern: the dataset and its iterator both have state. The dataset counts
    finished passes (its data changes with each), the iterator its position."""

    def __init__(self) -> None:
        self.passes = 0
        self.iter_calls = 0

    def __iter__(self) -> StreamIter:
        self.iter_calls += 1
        return StreamIter(self)

    def state_dict(self) -> dict[str, int]:
        return {"passes": self.passes}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.passes = state["passes"]


class StreamIter:
    def __init__(self, ds: Stream) -> None:
        self.ds, self.i = ds, 0

    def __iter__(self) -> StreamIter:
        return self

    def __next__(self) -> torch.Tensor:
        if self.i >= N:
            self.ds.passes += 1
            raise StopIteration
        self.i += 1
        return torch.tensor(self.i - 1 + 100 * self.ds.passes)

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


class PlainStream(IterableDataset):
    """No state at all: both loaders re-read the delivered batches and drop them."""

    def __init__(self) -> None:
        self.iter_calls = 0

    def __iter__(self) -> Any:
        self.iter_calls += 1
        return iter(torch.arange(N).tolist())


class Squares(Dataset):
    iter_calls = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i * i


def _flat(batch: Any) -> list[int]:
    return torch.as_tensor(batch).flatten().tolist()


def _run(cls: type, make: Callable[[], Any], save_at: tuple[int, int], kw: dict[str, Any]):
    """Batches of EPOCHS epochs, with the state taken at (epoch, batches into it; -1: right
    after iter()); then what a fresh loader given that state yields over EPOCHS epochs."""
    dataset = make()
    loader = cls(dataset, **kw)
    seen, state = [], None
    for epoch in range(EPOCHS):
        it = iter(loader)
        if save_at == (epoch, -1):
            state = loader.state_dict()
        for k, batch in enumerate(it, 1):
            seen.append(_flat(batch))
            if save_at == (epoch, k):
                state = loader.state_dict()
    assert state is not None, f"save point {save_at} never reached"
    again = make()
    fresh = cls(again, **kw)
    fresh.load_state_dict(state)
    rest = [_flat(b) for _ in range(EPOCHS) for b in fresh]
    return seen, rest, again.iter_calls


SAVE_POINTS = [(0, -1), (0, 2), (0, 4), (1, 1)]  # (0, 4): the last batch of the first epoch
CASES = {
    "stateful-stream": (Stream, {"batch_size": 3}),
    "plain-stream": (PlainStream, {"batch_size": 3}),
    "plain-stream-workers": (PlainStream, {"batch_size": 3, "num_workers": 2}),
    # Its pass counter goes up inside the persistent workers: saved from the workers.
    "stateful-stream-workers-persistent": (
        Stream, {"batch_size": 3, "num_workers": 2, "persistent_workers": True}
    ),
    "map": (Squares, {"batch_size": 3}),
    "map-workers-persistent": (
        Squares, {"batch_size": 3, "num_workers": 2, "persistent_workers": True}
    ),
}


@pytest.mark.parametrize("save_at", SAVE_POINTS, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_matches_torchdata(case: str, save_at: tuple[int, int]) -> None:
    need("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader as Torchdata

    make, kw = CASES[case]
    kw = {**kw, "snapshot_every_n_steps": 2}
    seen_td, rest_td, calls_td = _run(Torchdata, make, save_at, kw)
    seen_st, rest_st, calls_st = _run(stoker.StatefulDataLoader, make, save_at, kw)
    assert seen_st == seen_td
    assert rest_st == rest_td
    if make is not Squares:
        assert calls_st <= calls_td
        assert calls_st == (EPOCHS if kw.get("num_workers", 0) == 0 else 0)


def test_a_torchdata_state_is_refused_with_what_to_do() -> None:
    need("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader as Torchdata

    state = Torchdata(Squares(), batch_size=3).state_dict()
    with pytest.raises(ValueError) as info:
        stoker.StatefulDataLoader(Squares(), batch_size=3).load_state_dict(state)
    assert "torchdata StatefulDataLoader state cannot be loaded" in str(info.value)


def test_snapshot_every_n_steps_is_checked() -> None:
    with pytest.raises(ValueError) as info:
        stoker.StatefulDataLoader(Squares(), snapshot_every_n_steps=-1)
    assert str(info.value) == (
        "snapshot_every_n_steps=-1: expected a number of steps (int >= 0) or None, as "
        "torchdata's StatefulDataLoader takes; stoker's state is exact after every step "
        "whatever the value."
    )
    assert stoker.DataLoader(Squares(), snapshot_every_n_steps=None).snapshot_every_n_steps is None
    # 0 as torchdata takes it (no periodic snapshot; its own tests pass 0): accepted, exact.
    assert stoker.DataLoader(Squares(), snapshot_every_n_steps=0).snapshot_every_n_steps == 0
