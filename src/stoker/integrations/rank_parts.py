"""Gather every rank's loader states where a framework saves one for all ranks (NOTE [ Every
rank's part ] in ``engine.rank_state``).

Collective: call it only where every rank of the default process group calls it at once, with
its loaders' states in the same order (``stoker.integrations.lightning`` calls it inside
Lightning's ``dump_checkpoint``, which every rank runs, followed by a barrier of Lightning's).
"""

from __future__ import annotations

from typing import Any

from stoker.engine.cursor import STATE_FORMAT
from stoker.engine.rank_state import with_ranks


def is_loader_state(value: Any) -> bool:
    """A stamped stoker loader state (``DataLoader.state_dict()``)."""
    return isinstance(value, dict) and value.get("format") == STATE_FORMAT and "digest" in value


def _world() -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return int(dist.get_world_size())


def gather_rank_parts(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``states`` (this rank's loader states), each replaced by rank 0's state of that loader
    with every rank's part; unchanged outside a process group of 2 or more ranks, or where the
    ranks' states do not line up (another number of loaders, a rank unrecorded)."""
    world = _world()
    if world < 2 or not states:
        return states
    import torch.distributed as dist

    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, states)
    if any(not isinstance(theirs, list) or len(theirs) != len(states) for theirs in everyone):
        return states
    gathered = []
    for i, own in enumerate(states):
        merged = with_ranks([theirs[i] for theirs in everyone])
        gathered.append(own if merged is None else merged)
    return gathered
