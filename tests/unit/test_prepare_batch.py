"""``stoker_prepare_batch``: a dataset that defines it sees each batch's indices before its
samples are read (stoker.formats.TarShards fetches what a batch needs from storage at once);
the samples are read exactly as without it."""

from __future__ import annotations

from typing import Any

import pytest

from stoker._core.specs import FetchSpec
from stoker.fetch.fetchers import MapFetcher


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __len__(self) -> int:
        return 8

    def stoker_prepare_batch(self, indices: list[int]) -> None:
        self.calls.append(("prepare", list(indices)))

    def __getitem__(self, i: int) -> int:
        self.calls.append(("get", i))
        return i * 10


def test_the_batch_is_announced_before_its_samples_are_read() -> None:
    dataset = Recording()
    fetcher = MapFetcher(FetchSpec(dataset, "map", True, list, False))
    assert fetcher.fetch([3, 1, 5]) == [30, 10, 50]
    assert dataset.calls == [("prepare", [3, 1, 5]), ("get", 3), ("get", 1), ("get", 5)]


def test_without_auto_batching_nothing_is_announced() -> None:
    dataset = Recording()
    fetcher = MapFetcher(FetchSpec(dataset, "map", False, lambda x: x, False))
    assert fetcher.fetch(2) == 20
    assert dataset.calls == [("get", 2)]


def test_waiting_batches_are_announced_after_the_current_one_and_once_each() -> None:
    dataset = Recording()
    fetcher = MapFetcher(FetchSpec(dataset, "map", True, list, False))
    fetcher.upcoming = [((0, 1), [2, 4]), ((0, 2), [6])]
    assert fetcher.fetch([3, 1]) == [30, 10]
    assert dataset.calls == [("prepare", [3, 1]), ("prepare", [2, 4]), ("prepare", [6]),
                             ("get", 3), ("get", 1)]
    dataset.calls.clear()
    fetcher.upcoming = [((0, 2), [6]), ((1, 2), [7])]  # (epoch 0, task 2) was shown already
    assert fetcher.fetch([2, 4]) == [20, 40]
    assert dataset.calls == [("prepare", [2, 4]), ("prepare", [7]), ("get", 2), ("get", 4)]
    assert fetcher.upcoming == []


def test_a_failing_announce_is_raised_by_its_own_batch_only() -> None:
    class Failing(Recording):
        def stoker_prepare_batch(self, indices: list[int]) -> None:
            if 6 in indices:
                raise OSError("store down")
            super().stoker_prepare_batch(indices)

    dataset = Failing()
    fetcher = MapFetcher(FetchSpec(dataset, "map", True, list, False))
    fetcher.upcoming = [((0, 1), [6])]
    assert fetcher.fetch([3]) == [30]
    with pytest.raises(OSError, match="store down"):
        fetcher.fetch([6])
