"""NOTE [ The sample index from the batch's iterator ]: with the fast paths on, the fetch loop
publishes its list iterator instead of each index; ``stoker.sample_seed()`` inside
``__getitem__`` must still see the sample being loaded, exactly as with per-sample publishing."""

from __future__ import annotations

from typing import Any

import pytest

import stoker
from stoker._core.specs import FetchSpec
from stoker.fetch.fetchers import MapFetcher
from stoker.sampling.sample_rng import CURSOR_WORKS, SAMPLE_CONTEXT


class SeedPerSample:
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, stoker.sample_seed()


def _seeds(index: list[int], fast_paths: bool) -> list[Any]:
    spec = FetchSpec(SeedPerSample(), "map", True, list, False, fast_paths=fast_paths)
    fetcher = MapFetcher(spec)
    fetcher.sample_context = (1234, 2)
    return fetcher.fetch(index)


def test_this_interpreter_reports_list_iterator_positions() -> None:
    assert CURSOR_WORKS  # CPython 3.10-3.13: else the per-sample loop is used


@pytest.mark.parametrize("index", [[4, 1, 9], [3, 3, 5, 3], [7], []])
def test_each_sample_sees_its_own_index_as_with_per_sample_publishing(index: list[int]) -> None:
    fast, plain = _seeds(index, True), _seeds(index, False)
    assert fast == plain
    assert [i for i, _ in fast] == index
    assert len({seed for _, seed in fast}) == len(set(index))  # one seed per distinct index
    assert getattr(SAMPLE_CONTEXT, "index", None) is None  # nothing left published


def test_the_context_is_cleared_when_a_sample_raises() -> None:
    class Raising(SeedPerSample):
        def __getitem__(self, i: int) -> tuple[int, int]:
            if i == 2:
                raise ValueError("bad sample 2")
            return super().__getitem__(i)

    fetcher = MapFetcher(FetchSpec(Raising(), "map", True, list, False))
    fetcher.sample_context = (1, 0)
    with pytest.raises(ValueError, match="bad sample 2"):
        fetcher.fetch([0, 1, 2, 3])
    assert getattr(SAMPLE_CONTEXT, "index", None) is None
    with pytest.raises(RuntimeError, match="only work while a stoker DataLoader"):
        stoker.sample_seed()
