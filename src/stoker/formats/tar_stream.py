"""``TarShardStream``: tar shards read front to back, as an iterable dataset, for shards without
an index where scanning all of them before the first sample costs too much (a large remote
dataset read once). Prefer ``TarShards`` (map-style, exact shuffle) whenever it can be used.

Shuffle quality (what the order is, exactly):

* the shard order is a permutation drawn from (seed, epoch), the same on every rank;
* shards go round-robin to the ``world_size x num_workers`` readers (``shard_list``); each
  reader reads its shards whole, in that order, one after the other;
* each reader passes its samples through a buffer of ``shuffle_buffer`` samples and yields a
  uniformly random one of the buffer each time a new sample comes in. A sample therefore comes
  out no earlier than ``shuffle_buffer`` positions before where it went in, and samples of one
  shard stay near each other in the stream unless the buffer holds several shards' worth:
  with shards of S samples and a buffer of B, a batch mixes about B / S + 1 shards. That is
  WebDataset's shuffle; ``TarShards`` has none of these limits.
* the buffer starts yielding once it holds ``shuffle_initial`` samples (default 100, as
  WebDataset's ``initial``) and then grows to ``shuffle_buffer`` taking two samples in per one
  out: an epoch's first batch waits for about one shard instead of B / S shards, and its
  first ~B samples are drawn from a smaller buffer (from ``shuffle_initial`` growing to B).
  ``shuffle_initial=shuffle_buffer`` fills the buffer before the first sample.
* The loader gives each worker's batches in turn, so a batch holds one reader's samples.

From object storage with a cache, each reader hands its shard list to the source's ``plan``:
while it reads shard k, shards k+1 .. k+lookahead_shards download in the background (NOTE
[ Shard prefetch order ]).

Guarantees the map-style readers have and this one has not: ranks may read different numbers of
samples (when shards differ in size or their count does not divide evenly; under DDP that can
leave one rank waiting at the epoch's end: use ``TarShards``); a resume replays the epoch up to
the saved point (the loader's fast-forward of an IterableDataset); the order depends on the
world size and ``num_workers``. It is deterministic for a given seed, epoch, world size and
``num_workers``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from stoker.distributed import shard_info, shard_list
from stoker.formats._common import default_source
from stoker.formats.tar_index import scan_bytes, shard_bytes
from stoker.storage import ByteSource


class TarShardStream(IterableDataset[Any]):
    """Samples of tar shards, streamed: the same dicts as ``TarShards`` yields (``__key__``,
    ``__url__``, one ``bytes`` per field), through ``transform``. Call ``set_epoch(n)`` before
    each epoch for a new order (stoker's loader does not know an iterable dataset's epochs)."""

    def __init__(
        self,
        shards: Sequence[str],
        *,
        source: ByteSource | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        shuffle_buffer: int = 1000,
        shuffle_initial: int = 100,
        seed: int = 0,
    ) -> None:
        if not shards:
            raise ValueError("no shards given: pass a list of .tar paths or URLs")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer={shuffle_buffer}: expected 0 (no shuffle) or more")
        if shuffle_initial < 1:
            raise ValueError(f"shuffle_initial={shuffle_initial}: expected 1 or more (samples "
                             "buffered before the first one is yielded)")
        self.shards = list(shards)
        self.source = default_source(self.shards[0], source)
        self.transform, self.shuffle_buffer, self.seed = transform, shuffle_buffer, seed
        self.shuffle_initial = min(shuffle_initial, max(1, shuffle_buffer))
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _samples(self, path: str) -> Iterator[dict[str, Any]]:
        with shard_bytes(self.source, path) as view:
            table = scan_bytes(view, path)  # validates the whole shard before any sample
            starts, keys, fields, offsets, sizes, _ = table.lists
            for j, key in enumerate(keys):
                sample: dict[str, Any] = {"__key__": key, "__url__": path}
                for m in range(starts[j], starts[j + 1]):
                    sample[fields[m]] = bytes(view[offsets[m] : offsets[m] + sizes[m]])
                yield sample

    def __iter__(self) -> Iterator[Any]:
        order = list(self.shards)
        random.Random(f"{self.seed}/{self.epoch}/shards").shuffle(order)
        info = shard_info()
        rng = random.Random(f"{self.seed}/{self.epoch}/{info.shard_id}/{info.num_shards}")
        buffer: list[dict[str, Any]] = []
        mine = shard_list(order, info)
        plan = getattr(self.source, "plan", None)
        if plan is not None:  # a remote source fetches this reader's next shards ahead
            plan(mine)
        incoming = (sample for path in mine for sample in self._samples(path))
        for sample in incoming:
            buffer.append(sample)
            if len(buffer) <= self.shuffle_buffer:  # growing: two samples in per one out
                extra = next(incoming, None)
                if extra is not None:
                    buffer.append(extra)
                if len(buffer) < self.shuffle_initial:
                    continue
            k = rng.randrange(len(buffer))
            buffer[k], buffer[-1] = buffer[-1], buffer[k]
            yield self._out(buffer.pop())
        rng.shuffle(buffer)
        for sample in buffer:
            yield self._out(sample)

    def _out(self, sample: dict[str, Any]) -> Any:
        return sample if self.transform is None else self.transform(sample)
