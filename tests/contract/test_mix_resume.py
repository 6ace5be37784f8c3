"""``stoker.mix.Mix`` inside ``stoker.DataLoader``: resumes exactly, in workers too.

(Named ``test_mix_resume.py``: ``tests/unit/test_mix.py`` exists and the test directories are
not packages, so two ``test_mix.py`` would collide at collection.)

The sources draw a random augmentation per sample, so seeding is covered as well: every test
that resumes with the ``num_workers`` it saved with runs under explicit per-batch seeding and
under the default, torch's per-worker seeding (the ``seeding`` fixture in ``conftest.py``; its
docstring says why the default's loaders seed the global RNGs first); resuming at another
``num_workers`` is a promise of per-batch seeding alone (under torch's seeding the rest of the
epoch depends on which worker loads which batch), so that test names it alone.

A map-style mix is resumed by the loader like any map-style dataset (O(1) skip); an iterable
mix is re-read and fast-forwarded, which is exact because each shard's mix is a deterministic
function of (seed, epoch, shard) (see ``stoker.mix``).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from _seeding import seeding_kwargs
from torch.utils.data import Dataset, IterableDataset

import stoker
from stoker.distributed import shard_iterable
from stoker.engine import cursor
from stoker.mix import Mix
from stoker.testing import assert_resumes_exactly


def _sample(source: int, i: int) -> dict[str, Any]:
    return {"source": source, "index": i, "np": np.random.rand(), "torch": torch.rand(2)}


class Source(Dataset):
    def __init__(self, source: int, n: int) -> None:
        self.source, self.n = source, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _sample(self.source, i)


class Stream(IterableDataset):
    """An iterable source; it does not shard itself (the mix shards it)."""

    def __init__(self, source: int, n: int) -> None:
        self.source, self.n = source, n

    def __iter__(self) -> Any:
        return (_sample(self.source, i) for i in range(self.n))


class SelfShardingStream(Stream):
    def __iter__(self) -> Any:
        return (_sample(self.source, i) for i in shard_iterable(range(self.n)))


def map_mix(stop: str = "first_exhausted", epoch: int = 0) -> Any:
    mix = Mix([Source(0, 9), Source(1, 14), Source(2, 5)], weights=[2, 1, 1], seed=5, stop=stop)
    if epoch:
        mix.set_epoch(epoch)
    return mix


def iterable_mix(stop: str = "first_exhausted", **kwargs: Any) -> Any:
    return Mix([Stream(0, 12), Source(1, 10), Stream(2, 6)], weights=[2, 1, 1], seed=5,
               stop=stop, **kwargs)


def loader(dataset: Any, num_workers: int = 0, seeding: str = "per_batch", **kwargs: Any) -> Any:
    """``seeding="default"`` names none (torch's) and seeds the global RNGs first, as a script
    does at its start (``conftest.seeding``)."""
    return stoker.DataLoader(dataset, num_workers=num_workers,
                             generator=torch.Generator().manual_seed(1),
                             **seeding_kwargs(seeding), **kwargs)


@pytest.mark.parametrize(
    ("num_workers", "stop", "shuffle", "steps"),
    [(0, "first_exhausted", True, None), (0, "all_exhausted", False, None),
     (0, "cycle", True, None), (2, "first_exhausted", True, 5), (2, "all_exhausted", False, 4)],
)
def test_map_mix_resumes(
    num_workers: int, stop: str, shuffle: bool, steps: int | None, seeding: str
) -> None:
    check = assert_resumes_exactly(
        lambda: loader(map_mix(stop), num_workers, batch_size=4, shuffle=shuffle,
                       seeding=seeding),
        steps=steps,
    )
    assert sum(check.epoch_lengths) > 0


def test_map_mix_epoch_travels_with_the_loader_state(seeding: str) -> None:
    # The saving loader's mix is at epoch 2; the resumed one is built at epoch 0 and gets the
    # epoch back from the loader's state (``dataset_state``).
    check = assert_resumes_exactly(
        lambda: loader(map_mix(epoch=2), batch_size=3, shuffle=True, seeding=seeding),
        resume_loader=lambda: loader(map_mix(), batch_size=3, shuffle=True, seeding=seeding),
    )
    assert check.resumes > 2


def test_map_mix_with_different_num_workers_after_resume() -> None:
    # Per-batch seeding only (module docstring).
    assert_resumes_exactly(
        lambda: loader(map_mix(), 2, batch_size=4, shuffle=True),
        resume_loader=lambda: loader(map_mix(), 0, batch_size=4, shuffle=True),
        steps=4,
    )


def test_map_mix_sharded(seeding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert_resumes_exactly(
        lambda: loader(map_mix("all_exhausted"), batch_size=3, shuffle=True, shard=True,
                       seeding=seeding)
    )


_FAST_FORWARD = re.escape("Resuming IterableMix (an IterableDataset) by reading its first ")


@pytest.mark.parametrize(
    ("num_workers", "stop", "steps"),
    [(0, "first_exhausted", None), (0, "all_exhausted", None), (2, "first_exhausted", 5),
     (2, "all_exhausted", 4)],
)
def test_iterable_mix_resumes(
    num_workers: int, stop: str, steps: int | None, seeding: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())  # see test_resume_contract
    if num_workers == 0:
        # In-process, the mix's own iterator state is restored (torchdata's semantics for an
        # iterator with state_dict/load_state_dict): nothing is read again, nothing to warn.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert_resumes_exactly(
                lambda: loader(iterable_mix(stop), 0, batch_size=3, seeding=seeding))
        return
    with pytest.warns(UserWarning, match=_FAST_FORWARD):
        assert_resumes_exactly(
            lambda: loader(iterable_mix(stop), num_workers, batch_size=3, seeding=seeding),
            steps=steps,
        )


def test_iterable_mix_cycle_with_num_samples_resumes(
    seeding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())
    with pytest.warns(UserWarning, match=_FAST_FORWARD):
        check = assert_resumes_exactly(
            lambda: loader(iterable_mix("cycle", num_samples=40), 2, batch_size=4,
                           seeding=seeding),
            steps=4,
        )
    assert sum(check.epoch_lengths) == 2 * 10


def _keys(batches: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [
        (int(s), int(i)) for b in batches
        for s, i in zip(b["source"].tolist(), b["index"].tolist(), strict=True)
    ]


def test_workers_read_distinct_parts_of_an_iterable_mix() -> None:
    keys = _keys(list(loader(iterable_mix(), 2, batch_size=2)))
    assert len(keys) == len(set(keys)), "a sample was read by two workers"
    single = _keys(list(loader(iterable_mix(), 0, batch_size=2)))
    assert len(single) == len(set(single))


def test_self_sharding_sources_with_shard_sources_off() -> None:
    mix = Mix([SelfShardingStream(0, 12), SelfShardingStream(1, 8)], seed=5,
              stop="all_exhausted", shard_sources=False)
    keys = _keys(list(loader(mix, 2, batch_size=2)))
    assert {(s, i) for s, n in ((0, 12), (1, 8)) for i in range(n)} <= set(keys)
