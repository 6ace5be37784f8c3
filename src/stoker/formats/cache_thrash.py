"""Telling a user, once, that the sampler's order and the shard cache do not go together.

NOTE [ A cache the order thrashes ]
A remote ``TarShards`` in shard mode reads a sample from its whole shard, downloaded into a
cache of ``cache_bytes``. A sequential order reads each shard once per pass whatever the cache
holds. A shuffled order touches every shard again and again through the epoch: once the
shards it touches outgrow the cache, least-recently-used eviction drops shards that are needed
again soon, and each is downloaded again, up to once per sample (1.1 GETs per sample measured
with room for 3-6 shards): far more bytes than the dataset, and slower than one ranged read
per sample. Nothing fails; the epoch is just many times slower.

The main process sees every batch's shards before they are fetched (``stoker_fetch_for_batch``),
so it replays them through a model of the cache: least recently used, ``cache_bytes`` large, as
if this process alone used it (processes sharing the directory leave each less, so the model
errs on the quiet side). A miss on a shard the model held before is a download that the cache
size caused. Those are compared with what a sequential read of the same samples would download
(samples / samples per shard): more than 3 times that, and at least 8, is warned about once,
with the sizes and the switches. A sequential order over a pack larger than the cache misses
each shard once per pass, never more, and is not warned about; nor are first reads.
"""

from __future__ import annotations

from collections import OrderedDict

_RATIO = 3  # re-downloads per shard a sequential read would need, before warning
_AT_LEAST = 8


class ThrashWatch:
    """A model of the shard cache fed with each batch's shards; ``see`` returns a warning's
    text the first time the order evicts too many shards it needs again, else None."""

    def __init__(self, budget_bytes: int, samples_per_shard: float, dataset_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.samples_per_shard = max(samples_per_shard, 1.0)
        self.dataset_bytes = dataset_bytes
        self._held: OrderedDict[int, int] = OrderedDict()  # shard -> bytes, least recent first
        self._held_bytes = 0
        self._seen: set[int] = set()
        self._seen_bytes = 0
        self._samples = 0
        self._again = 0  # misses on shards seen before: downloads the cache's size caused
        self.warned = False

    def see(self, shards: dict[int, int], samples: int) -> str | None:
        """One batch: ``shards`` maps each shard it reads to its size, ``samples`` its length."""
        if self.warned:
            return None
        self._samples += samples
        for shard, size in shards.items():
            if shard in self._held:
                self._held.move_to_end(shard)
                continue
            if shard in self._seen:
                self._again += 1
            else:
                self._seen.add(shard)
                self._seen_bytes += size
            self._held[shard] = size
            self._held_bytes += size
            while self._held_bytes > self.budget_bytes and len(self._held) > 1:
                self._held_bytes -= self._held.popitem(last=False)[1]
        sequential = self._samples / self.samples_per_shard
        if self._again < max(_AT_LEAST, _RATIO * sequential):
            return None
        self.warned = True
        return (
            f"TarShards: the sampler's order has read {self._samples} samples from shards "
            f"scattered over {self._seen_bytes / 2**20:.1f} MiB, and the shard cache holds "
            f"{self.budget_bytes / 2**20:.1f} MiB: about {self._again} shards were evicted "
            "before they were read again and downloaded anew (a sequential read of those "
            f"samples downloads about {max(1, round(sequential))}). Raise cache_bytes to the "
            f"dataset's {self.dataset_bytes / 2**20:.1f} MiB, read by range "
            "(open_source(..., fetch='range')), or stream the shards in order "
            "(TarShardStream)"
        )
