"""Make ``torch.utils.data.get_worker_info()`` answer inside stoker's workers.

User datasets shard themselves with torch's function, so stoker sets torch's own per-process
record rather than a parallel one. The record is a subclass of torch's ``WorkerInfo`` that
also carries the rank, so an IterableDataset can shard over ranks × workers with
``info.shard_id`` / ``info.num_shards`` (``stoker.distributed.shard_iterable`` does it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data._utils import worker as _torch_worker


@dataclass(frozen=True, slots=True)
class StokerWorkerInfo(_torch_worker.WorkerInfo):
    rank: int = 0
    world_size: int = 1

    @property
    def shard_id(self) -> int:
        """This worker's shard among all ranks' workers: rank × num_workers + id."""
        return self.rank * self.num_workers + self.id

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers


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
