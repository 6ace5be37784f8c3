"""Fetchers: turn an index, a batch of indices, or the next iterable items into a batch.

Semantics follow torch's fetchers: ``__getitems__`` is used when truthy; an iterable dataset's
last partial batch is dropped when ``drop_last``; an exhausted iterable raises
``StopIteration`` and stays exhausted. One deliberate difference: a ``StopIteration`` escaping a
map-style ``__getitem__`` is an error here, where torch silently ends the epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stoker._core.specs import FetchSpec


class MapFetcher:
    def __init__(self, spec: FetchSpec) -> None:
        self._dataset = spec.dataset
        self._collate = spec.collate_fn
        self._auto = spec.auto_collation
        getitems = getattr(spec.dataset, "__getitems__", None)
        self._getitems: Callable[[Any], Any] | None = getitems if getitems else None

    def fetch(self, index: Any) -> Any:
        try:
            if not self._auto:
                return self._collate(self._dataset[index])
            if self._getitems is not None:
                data = self._getitems(index)
            else:
                data = [self._dataset[i] for i in index]
            return self._collate(data)
        except StopIteration as exc:
            # torch lets this end the epoch early without a word; like PEP 479 for
            # generators, a StopIteration leaking out of __getitem__ is a bug to report.
            raise RuntimeError(
                "StopIteration raised by the map-style dataset (or collate_fn) while loading "
                "this batch. A map-style dataset ends where len(dataset) says; raising "
                "StopIteration would silently cut the epoch short, so stoker stops here. "
                "Raise IndexError (or fix __len__) instead."
            ) from exc


class IterableFetcher:
    def __init__(self, spec: FetchSpec) -> None:
        self._iter = iter(spec.dataset)
        self._collate = spec.collate_fn
        self._auto = spec.auto_collation
        self._drop_last = spec.drop_last
        self._ended = False

    def fetch(self, index: Any) -> Any:
        if self._ended:
            raise StopIteration
        if not self._auto:
            return self._collate(next(self._iter))
        data = []
        for _ in index:
            try:
                data.append(next(self._iter))
            except StopIteration:
                self._ended = True
                break
        if not data or (self._drop_last and len(data) < len(index)):
            raise StopIteration
        return self._collate(data)


def make_fetcher(spec: FetchSpec) -> MapFetcher | IterableFetcher:
    return MapFetcher(spec) if spec.kind == "map" else IterableFetcher(spec)
