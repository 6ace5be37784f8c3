"""Make ``torch.utils.data.get_worker_info()`` answer inside stoker's workers.

User datasets shard themselves with torch's function, so stoker sets torch's own per-process
record rather than a parallel one. The record is a subclass of torch's ``WorkerInfo`` that
also carries the rank, so an IterableDataset can shard over ranks × workers with
``info.shard_id`` / ``info.num_shards`` (``stoker.distributed.shard_iterable`` does it).

torch 2.13's ``WorkerInfo`` is a frozen dataclass; before it, a plain class taking keyword
arguments and read-only once built. Both shapes are subclassed, so stoker runs on the torch a
GPU machine ships (2.11 on the lent H100s) as on the pinned 2.13.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch.utils.data._utils import worker as _torch_worker


class _ShardIds:
    __slots__ = ()
    id: int
    num_workers: int
    rank: int
    world_size: int

    @property
    def shard_id(self) -> int:
        """This worker's shard among all ranks' workers: rank × num_workers + id."""
        return self.rank * self.num_workers + self.id

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers


def worker_info_class(base: type) -> type:
    """A subclass of ``base`` (torch's ``WorkerInfo``, either shape) with rank and world_size."""
    if dataclasses.is_dataclass(base):

        @dataclasses.dataclass(frozen=True, slots=True)
        class DataclassInfo(_ShardIds, base):  # type: ignore[misc, valid-type]
            rank: int = 0
            world_size: int = 1

        return DataclassInfo

    class KeywordInfo(_ShardIds, base):  # type: ignore[misc, valid-type]
        # torch < 2.13: WorkerInfo(**kwargs) sets each keyword, then refuses setattr.
        def __init__(self, *, rank: int = 0, world_size: int = 1, **kwargs: Any) -> None:
            super().__init__(rank=rank, world_size=world_size, **kwargs)

    return KeywordInfo


StokerWorkerInfo = worker_info_class(_torch_worker.WorkerInfo)
StokerWorkerInfo.__name__ = StokerWorkerInfo.__qualname__ = "StokerWorkerInfo"


def set_worker_info(
    worker_id: int, num_workers: int, seed: int, dataset: Any, rank: int = 0, world_size: int = 1
) -> None:
    _torch_worker._worker_info = StokerWorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset,
        rank=rank, world_size=world_size,
    )


def get_worker_info() -> Any:
    """The current worker's ``torch.utils.data.WorkerInfo``; ``None`` in the main process."""
    return _torch_worker._worker_info
