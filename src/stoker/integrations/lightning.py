"""Lightning's checkpoints carry every rank's part of a stoker loader's state.

Lightning's ``Trainer.save_checkpoint`` runs ``_CheckpointConnector.dump_checkpoint`` on every
rank (then writes rank 0's dict, and waits at a barrier), and a resume loads that one dict on
every rank. ``install`` (run by the import watch ``import stoker`` sets, once Lightning's
checkpoint connector is imported) wraps ``dump_checkpoint``: after Lightning's own code, the
stoker loader states in the checkpoint's ``"loops"`` are gathered from every rank and each
replaced by rank 0's with every rank's part (NOTE [ Every rank's part ] in
``engine.rank_state``). A rank with no stoker loader state gathers nothing, and no collective
runs outside a process group of 2 or more ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

TARGETS = (
    "lightning.pytorch.trainer.connectors.checkpoint_connector",
    "pytorch_lightning.trainer.connectors.checkpoint_connector",
)


def _slots(tree: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key) of every stoker loader state inside ``tree`` (dicts and lists)."""
    from stoker.integrations.rank_parts import is_loader_state

    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(
        tree, list) else ()
    for key, value in items:
        if is_loader_state(value):
            yield tree, key
        elif isinstance(value, (dict, list)):
            yield from _slots(value)


def with_rank_parts(checkpoint: Any) -> Any:
    """``checkpoint`` with its loader states carrying every rank's part (every rank calls it)."""
    from stoker.integrations.rank_parts import gather_rank_parts

    loops = checkpoint.get("loops") if isinstance(checkpoint, dict) else None
    slots = list(_slots(loops)) if loops is not None else []
    if not slots:
        return checkpoint
    gathered = gather_rank_parts([container[key] for container, key in slots])
    for (container, key), state in zip(slots, gathered, strict=True):
        container[key] = state
    return checkpoint


def install(module: ModuleType) -> None:
    """Wrap ``module._CheckpointConnector.dump_checkpoint`` (once)."""
    connector = getattr(module, "_CheckpointConnector", None)
    dump = getattr(connector, "dump_checkpoint", None)
    if dump is None or getattr(dump, "__stoker_wrapped__", False):
        return

    @functools.wraps(dump)
    def dump_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        return with_rank_parts(dump(self, *args, **kwargs))

    dump_checkpoint.__stoker_wrapped__ = True  # type: ignore[attr-defined]
    connector.dump_checkpoint = dump_checkpoint  # type: ignore[union-attr]
