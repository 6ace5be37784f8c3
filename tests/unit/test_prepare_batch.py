"""``stoker_prepare_batch``: a dataset that defines it sees each batch's indices before its
samples are read (stoker.formats.TarShards fetches what a batch needs from storage at once);
the samples are read exactly as without it."""

from __future__ import annotations

from typing import Any

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
