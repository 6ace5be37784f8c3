"""Read each element of an ``IterableDataset`` once across ranks × workers.

torch runs a full copy of an ``IterableDataset.__iter__`` in every worker of every rank, so a
dataset that does not shard itself yields ``world_size * num_workers`` copies of each element.
The fix is one global shard id per reader::

    shard_id   = rank * num_workers + worker_id
    num_shards = world_size * num_workers

Inside ``__iter__`` (which runs in the worker), use one of::

    class Lines(IterableDataset):
        def __iter__(self):
            for path in shard_list(self.files):        # when there are >= num_shards files
                yield from open(path)
            # or: yield from shard_iterable(read_all_records())   # element-wise round robin

``shard_list`` only opens this shard's files; ``shard_iterable`` still pulls (and discards) the
other shards' elements from its source, so prefer ``shard_list`` when the source is a list of
files. With ``num_workers=0`` the main process is the only worker (id 0 of 1). The rank comes
from ``stoker.distributed.context.detect()``; pass ``info=`` to override both.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from torch.utils.data import get_worker_info

from stoker.distributed.context import DistContext, detect

T = TypeVar("T")


@dataclass(frozen=True)
class ShardInfo:
    """Where this reader sits in the grid of ranks × workers."""

    rank: int
    world_size: int
    worker_id: int
    num_workers: int

    @property
    def shard_id(self) -> int:
        return self.rank * self.num_workers + self.worker_id

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers


def shard_info(context: DistContext | None = None) -> ShardInfo:
    """This reader's shard: the rank from ``context`` (default: ``detect()``), the worker from
    ``torch.utils.data.get_worker_info()`` (stoker's workers set torch's own record)."""
    ctx = detect() if context is None else context
    worker = get_worker_info()
    if worker is None:  # num_workers=0: the main process reads everything for its rank
        return ShardInfo(ctx.rank, ctx.world_size, worker_id=0, num_workers=1)
    return ShardInfo(ctx.rank, ctx.world_size, worker_id=worker.id, num_workers=worker.num_workers)


def shard_iterable(iterable: Iterable[T], info: ShardInfo | None = None) -> Iterator[T]:
    """Every ``num_shards``-th element of ``iterable``, starting at this reader's ``shard_id``."""
    shard = shard_info() if info is None else info
    return itertools.islice(iterable, shard.shard_id, None, shard.num_shards)


def shard_list(items: Sequence[T], info: ShardInfo | None = None) -> list[T]:
    """This reader's share of ``items`` (same round robin as ``shard_iterable``).

    With fewer items than shards some readers get nothing; for files, have at least
    ``world_size * num_workers`` of them, or the extra workers and ranks idle.
    """
    shard = shard_info() if info is None else info
    return list(items[shard.shard_id :: shard.num_shards])
