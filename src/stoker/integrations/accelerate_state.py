"""Accelerate's ``save_state`` carries every rank's part of a stoker loader's state.

Under ``DataLoaderConfiguration(use_stateful_dataloader=True)``, ``accelerator.save_state()``
runs ``accelerate.checkpointing.save_accelerator_state`` on every rank, and there every rank
``torch.save``\\ s its loader's ``state_dict()`` (the adapter's ``dl_state_dict``, with
Accelerate's ``_iterator_finished`` added) to one shared ``dl_state_dict.bin``; ``load_state()``
loads that file on every rank. ``install`` (run by the import watch ``import stoker`` sets, once
``accelerate.checkpointing`` is imported) wraps that function: before Accelerate's code, the
stoker states of the prepared loaders are gathered from every rank and each rank's
``dl_state_dict`` becomes rank 0's state with every rank's part (NOTE [ Every rank's part ] in
``engine.rank_state``): the same on every rank, so the ranks write the same bytes to the one
file, and each rank loads its own part from it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType
from typing import Any

TARGET = "accelerate.checkpointing"
_NAME = "save_accelerator_state"
_BINDERS = ("accelerate.accelerator",)  # ``from .checkpointing import save_accelerator_state``


def _stateful_stoker_loaders(dataloaders: Any) -> list[Any]:
    """The prepared loaders over stoker loaders whose state Accelerate saves."""
    from stoker.integrations.accelerate import stoker_source
    from stoker.integrations.rank_parts import is_loader_state

    return [dl for dl in dataloaders or ()
            if getattr(dl, "use_stateful_dataloader", False) and stoker_source(dl) is not None
            and is_loader_state(getattr(dl, "dl_state_dict", None))]


def with_rank_parts(dataloaders: Any) -> None:
    """Give each stateful stoker loader's ``dl_state_dict`` every rank's part (every rank
    calls it)."""
    from stoker.integrations.rank_parts import gather_rank_parts

    loaders = _stateful_stoker_loaders(dataloaders)
    if not loaders:
        return
    states = [dl.dl_state_dict for dl in loaders]
    for dl, own, gathered in zip(loaders, states, gather_rank_parts(states), strict=True):
        # Accelerate's own keys (``_iterator_finished``) kept beside stoker's.
        foreign = {k: v for k, v in own.items() if isinstance(k, str) and k.startswith("_")}
        dl.dl_state_dict = {**gathered, **foreign}


def install(module: ModuleType) -> None:
    """Wrap ``module.save_accelerator_state`` and its binding in ``accelerate.accelerator``."""
    original = getattr(module, _NAME, None)
    if original is None or getattr(original, "__stoker_wrapped__", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def save_accelerator_state(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        with_rank_parts(bound.arguments.get("dataloaders"))
        return original(*args, **kwargs)

    save_accelerator_state.__stoker_wrapped__ = True  # type: ignore[attr-defined]
    setattr(module, _NAME, save_accelerator_state)
    for binder in _BINDERS:
        mod = sys.modules.get(binder)
        if mod is not None and getattr(mod, _NAME, None) is original:
            setattr(mod, _NAME, save_accelerator_state)
