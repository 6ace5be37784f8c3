"""``state_dict()`` has one key structure per loader, whatever the moment it is taken.

Checkpointers that match keys (``torch.distributed.checkpoint``: ``dcp.load`` fills the keys of
the state it is given from the checkpoint, descending into nested dicts) need the state of a
fresh loader to have exactly the keys of a mid-epoch one. The structure compared here is DCP's:
every path through nested mappings down to a leaf (a non-mapping value, lists included).
Checked for every loader configuration at: construction, after one batch, at the end of an
epoch, with a loaded state not yet applied, in the middle of the second epoch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from torch.utils.data import (
    Dataset,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
)

import stoker
from stoker.sampling.sharded import ShardedSampler

N = 10


def key_paths(state: Any, prefix: str = "") -> set[str]:
    """DCP's flattening: mappings are descended into; anything else is one leaf."""
    if not isinstance(state, Mapping):
        return {prefix}
    out: set[str] = set()
    for key, value in state.items():
        out |= key_paths(value, f"{prefix}.{key}" if prefix else str(key))
    return out


class StatefulSampler(SequentialSampler):
    """A sampler with its own state (position), as torchdata's samplers have."""

    def __init__(self, n: int) -> None:
        self.n, self.pos = n, 0

    def __iter__(self):  # type: ignore[override]
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1
        self.pos = 0

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class StatefulMap(Dataset):
    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "nested": {"calls": self.calls}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = state["nested"]["calls"]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(N).split(1))


class StatefulStream(Stream):
    def __init__(self) -> None:
        self.start = 0

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = state["start"]


def _tensors() -> TensorDataset:
    return TensorDataset(torch.arange(N))


CONFIGS: dict[str, Callable[[], stoker.DataLoader]] = {
    "map": lambda: stoker.DataLoader(_tensors(), batch_size=3),
    "map-shuffle-generator": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0)
    ),
    "map-shuffle-global-rng": lambda: stoker.DataLoader(_tensors(), batch_size=3, shuffle=True),
    "map-process-workers": lambda: stoker.DataLoader(
        StatefulMap(), batch_size=3, num_workers=2, worker_type="process"
    ),
    "map-out-of-order": lambda: stoker.DataLoader(
        _tensors(), batch_size=2, num_workers=2, worker_type="process", in_order=False
    ),
    "map-persistent-workers": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, num_workers=1, worker_type="process", persistent_workers=True
    ),
    "map-threads": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, num_workers=2, worker_type="thread"
    ),
    "map-no-batching": lambda: stoker.DataLoader(_tensors(), batch_size=None),
    "map-skip-errors": lambda: stoker.DataLoader(_tensors(), batch_size=3, on_error="skip"),
    "map-dataset-state": lambda: stoker.DataLoader(StatefulMap(), batch_size=3),
    "shard": lambda: stoker.DataLoader(_tensors(), batch_size=3, shuffle=True, shard=True),
    "shard-exact": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, shard=True, shard_even="exact"
    ),
    "sharded-sampler": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, sampler=ShardedSampler(N, rank=0, world_size=1)
    ),
    "stateful-sampler": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, sampler=StatefulSampler(N)
    ),
    "distributed-sampler": lambda: stoker.DataLoader(
        _tensors(), batch_size=3, sampler=DistributedSampler(_tensors(), 1, 0, shuffle=True)
    ),
    "iterable": lambda: stoker.DataLoader(Stream(), batch_size=3),
    "iterable-workers": lambda: stoker.DataLoader(Stream(), batch_size=3, num_workers=2),
    "iterable-dataset-state": lambda: stoker.DataLoader(StatefulStream(), batch_size=3),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_state_keys_are_the_same_before_during_and_after_an_epoch(name: str) -> None:
    loader = CONFIGS[name]()
    seen: dict[str, set[str]] = {"construction": key_paths(loader.state_dict())}
    it = iter(loader)
    seen["right after iter()"] = key_paths(loader.state_dict())
    next(it)
    mid = loader.state_dict()
    seen["after one batch"] = key_paths(mid)
    for _ in it:
        pass
    seen["end of epoch"] = key_paths(loader.state_dict())
    fresh = CONFIGS[name]()
    fresh.load_state_dict(mid)
    seen["loaded, not applied"] = key_paths(fresh.state_dict())
    second = iter(loader)
    next(second)
    seen["second epoch"] = key_paths(loader.state_dict())
    del second, it
    expected = seen["construction"]
    assert any(k.startswith("sampler_state") for k in expected)
    for moment, keys in seen.items():
        assert keys == expected, (moment, sorted(keys ^ expected))


class IteratorWithState:
    def __init__(self) -> None:
        self.i = 0

    def __iter__(self) -> IteratorWithState:
        return self

    def __next__(self) -> torch.Tensor:
        if self.i >= N:
            raise StopIteration
        self.i += 1
        return torch.tensor([self.i])

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


class StreamWithIteratorState(IterableDataset):
    def __iter__(self) -> IteratorWithState:
        return IteratorWithState()


def test_the_documented_exception_an_iterators_own_state() -> None:
    """docs/distributed.md (DCP): an IterableDataset whose iterator has ``state_dict`` adds
    it once an iterator exists; before that the key holds None. Nothing else differs."""
    loader = stoker.DataLoader(StreamWithIteratorState(), batch_size=3)
    before = key_paths(loader.state_dict())
    it = iter(loader)
    next(it)
    during = key_paths(loader.state_dict())
    assert before ^ during == {"dataset_iter_state", "dataset_iter_state.i"}
    for _ in it:
        pass
    assert key_paths(loader.state_dict()) == before


def test_key_paths_descends_into_mappings_only() -> None:
    assert key_paths({"a": 1, "b": {"c": [1, {"d": 2}], "e": None}}) == {"a", "b.c", "b.e"}
    assert list(itertools.islice(iter(CONFIGS), 1)) == ["map"]
