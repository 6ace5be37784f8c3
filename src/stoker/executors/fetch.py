"""Fetchers: turn an index, a batch of indices, or the next iterable items into a batch.

Semantics follow torch's fetchers exactly: ``__getitems__`` is used when truthy; an iterable
dataset's last partial batch is dropped when ``drop_last``; an exhausted iterable raises
``StopIteration`` and stays exhausted.
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
        if not self._auto:
            return self._collate(self._dataset[index])
        if self._getitems is not None:
            data = self._getitems(index)
        else:
            data = [self._dataset[i] for i in index]
        return self._collate(data)


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
