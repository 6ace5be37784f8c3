"""Which rank this process is, and how many there are.

``detect()`` looks, in order, at:

1. a context pinned with ``set_context()``: stoker's worker processes pin the main process's
   context at start-up, because a spawned or forkserver worker inherits neither the process
   group nor (under ``mp.spawn``) any ``RANK`` variable, and would otherwise think it is rank 0;
2. an initialized default process group (``torch.distributed.get_rank()/get_world_size()``):
   the authority once ``init_process_group`` ran, whatever launched the process;
3. the ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` variables torchrun (and most launchers) set,
   so a loader built *before* ``init_process_group`` already shards correctly;
4. otherwise a single process: ``DistContext(rank=0, world_size=1)``.

Detection is cheap and never caches: a process group may be created after the loader is built,
so the loader calls ``detect()`` at the start of each epoch, not at construction.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from stoker.sampling.sharded import Even, ShardedSampler

ContextSource = Literal["pinned", "process_group", "env", "default"]

_pinned: DistContext | None = None


@dataclass(frozen=True)
class DistContext:
    """This process's place among the ranks. Equality compares ``(rank, world_size)`` only."""

    rank: int
    world_size: int
    # LOCAL_RANK when the launcher set it; None when unknown (a plain init_process_group).
    local_rank: int | None = field(default=None, compare=False)
    source: ContextSource = field(default="default", compare=False)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"DistContext(rank={self.rank}, world_size={self.world_size}) is invalid: "
                "expected world_size >= 1 and 0 <= rank < world_size"
            )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def set_context(context: DistContext | None) -> None:
    """Pin this process's context (``None`` unpins). Called by stoker's workers at start-up."""
    global _pinned
    _pinned = context


def detect(environ: Mapping[str, str] | None = None) -> DistContext:
    """This process's ``DistContext`` (see the module docstring for the order of sources)."""
    if _pinned is not None:
        return _pinned
    env = os.environ if environ is None else environ
    local_rank = _env_int(env, "LOCAL_RANK")
    if dist.is_available() and dist.is_initialized():
        return DistContext(
            dist.get_rank(), dist.get_world_size(), local_rank=local_rank, source="process_group"
        )
    rank, world_size = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    if rank is None and world_size is None:
        return DistContext(0, 1, local_rank=local_rank, source="default")
    if rank is None or world_size is None:
        have, missing = ("RANK", "WORLD_SIZE") if world_size is None else ("WORLD_SIZE", "RANK")
        raise ValueError(
            f"{have}={env[have]!r} is set but {missing} is not: a launcher such as torchrun sets "
            f"both; set {missing} too, or unset {have} to run as a single process"
        )
    try:
        return DistContext(rank, world_size, local_rank=local_rank, source="env")
    except ValueError as exc:
        raise ValueError(f"from the environment: {exc}") from None


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of ``detect()``: a module-level function, so it pickles."""
    ctx = detect()
    return ctx.rank, ctx.world_size


def rank_share(dataset: Any, sampler: Any, batch_sampler: Any, shuffle: Any,
               generator: torch.Generator | None, even: Even) -> ShardedSampler:
    """``DataLoader(shard=True)``'s sampler: this rank's share of each epoch's order."""
    if sampler is not None or batch_sampler is not None:
        raise ValueError(
            "shard=True builds its own sampler (this rank's share of each epoch); "
            "remove sampler=/batch_sampler=, or drop shard=True and pass a "
            "DistributedSampler yourself (a DistributedSampler passed with shard=True, as "
            "Lightning injects one, is used in place of stoker's)."
        )
    # Every rank must draw the same order: seed from the generator (seeded alike on every
    # rank) or 0, like DistributedSampler's default.
    seed = 0 if generator is None else int(
        torch.empty((), dtype=torch.int64).random_(generator=generator).item()
    )
    # Rank and world size are read when a pass starts, not now: Lightning's ddp builds the
    # loader before the process group exists, with WORLD_SIZE set and RANK not yet.
    from stoker.sampling.sharded import ShardedSampler

    return ShardedSampler(
        len(dataset), shuffle=bool(shuffle), seed=seed, even=even, context=rank_and_world,
    )


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={raw!r} is not an integer; launchers set it to the "
            "process's index (e.g. 0)"
        ) from None
