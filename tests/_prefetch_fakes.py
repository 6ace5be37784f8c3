"""A stand-in for the ``RemoteSource`` a ``Prefetcher`` reads (``PrefetchSource`` in
``storage/prefetch_threads.py``), for unit tests that drive its claims with a fake cache:
shard mode, every object 10 bytes."""

from __future__ import annotations

from typing import Any


class ShardSource:
    fetch = "shard"

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def known_size(self, path: str) -> int:
        return 10
