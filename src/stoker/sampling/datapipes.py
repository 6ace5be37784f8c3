"""torch's DataPipe graph settings, applied where torch's DataLoader applies them.

A DataPipe graph (``torch.utils.data.datapipes``) shuffles and shards itself: its ``Shuffler``
nodes take a seed, its ``sharding_filter`` nodes a (number of shards, shard) pair. torch's
DataLoader sets both, and so does stoker, at the same moments and from the same draws:

- each iterator draws a *shared seed* from the loader's generator (one ``int64`` draw, before
  the sampler's; workers' iterators draw a second one after the base seed, and each later
  epoch of persistent workers one more), broadcast from rank 0 when ``torch.distributed`` is
  initialised, so every worker and rank shuffles alike;
- a worker seeds the graph's shufflers with it before ``worker_init_fn`` and at each new
  epoch, and shards the graph into ``num_workers * world_size`` parts, its part being
  ``worker_id * world_size + rank``; without workers the graph is sharded by rank only.

Without this, every worker iterated the whole graph: each element came ``num_workers`` times.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding


def is_iter_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, IterDataPipe)


def is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def distributed_settings() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def seed_group() -> Any:
    """The group a shared seed is broadcast over (torch makes one per iterator: a collective
    call, so every rank must start its iterators in step, as with torch)."""
    if dist.is_available() and dist.is_initialized():
        return dist.new_group(backend="gloo")
    return None


def draw_shared_seed(generator: torch.Generator | None, group: Any) -> int:
    seed = torch.empty((), dtype=torch.int64).random_(generator=generator)
    if group is not None:
        dist.broadcast(seed, src=0, group=group)
    return int(seed.item())


def seed_shufflers(dataset: Any, shared_seed: int) -> None:
    apply_random_seed(dataset, torch.Generator().manual_seed(shared_seed))


def shard(dataset: Any, num_workers: int, worker_id: int, world_size: int, rank: int) -> None:
    """This worker's part of the graph (``num_workers=1, worker_id=0``: the rank's part)."""
    apply_sharding(dataset, num_workers * world_size, worker_id * world_size + rank)
