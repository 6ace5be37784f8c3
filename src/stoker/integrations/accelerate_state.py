"""Accelerate's ``save_state`` / ``load_state`` resume each rank's stoker loader with its own
state.

NOTE [ Accelerate's one loader file ]
Under ``DataLoaderConfiguration(use_stateful_dataloader=True)``, ``accelerator.save_state()``
runs ``accelerate.checkpointing.save_accelerator_state``, where every rank ``torch.save``\\ s its
loader's state (the adapter's ``dl_state_dict``, with Accelerate's ``_iterator_finished``) to one
shared ``dl_state_dict.bin``, all at once; ``load_state()`` loads that file on every rank. A
loader's state is its rank's (NOTE [ Every rank's part ] in ``engine.rank_state``), so
``install`` (run by the import watch ``import stoker`` sets) wraps both functions, with no
collective (``save_state`` may be called on the main process alone, and must not hang there):

* saving, each rank that saves also writes its own state beside Accelerate's file, as
  ``stoker_dl_state_dict[_i]_rank<r>.bin``, and only each node's main process writes the shared
  file (the ranks' different states written to one file at once could interleave);
* loading, a rank that finds its own file loads that state where Accelerate loads the shared one
  (the shared one if the two are not at the same place of the same epoch: a file left from an
  older save). A rank without its own file loads the shared state, and stoker says that it is
  another rank's where it is.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TARGET = "accelerate.checkpointing"
_SAVE, _LOAD = "save_accelerator_state", "load_accelerator_state"
_BINDERS = ("accelerate.accelerator",)  # ``from .checkpointing import ...``
_PLACE = ("iterations", "epoch", "batches", "world_size")


def _own_file(directory: Any, i: int, rank: int) -> Path:
    """Where rank ``rank`` keeps its state of the ``i``-th loader (Accelerate's numbering)."""
    return Path(directory) / f"stoker_dl_state_dict{'' if i == 0 else f'_{i}'}_rank{rank}.bin"


def _stateful_stoker(dataloaders: Any) -> list[tuple[int, Any]]:
    """(Accelerate's index, loader) of the prepared loaders over stoker loaders whose state
    Accelerate saves."""
    from stoker.integrations.accelerate import stoker_source

    return [(i, dl) for i, dl in enumerate(dataloaders or ())
            if getattr(dl, "use_stateful_dataloader", False) and stoker_source(dl) is not None]


def _local_main() -> bool:
    from accelerate.state import PartialState

    return bool(PartialState().is_local_main_process)


def _save(original: Any, bound: inspect.BoundArguments) -> Any:
    import torch

    args = bound.arguments
    loaders = _stateful_stoker(args.get("dataloaders"))
    for i, dl in loaders:
        torch.save(dl.state_dict(), _own_file(args["output_dir"], i, args["process_index"]))
    quiet = [] if _local_main() else loaders
    for _, dl in quiet:
        dl.use_stateful_dataloader = False  # Accelerate's shared file: not from this rank
    try:
        return original(*bound.args, **bound.kwargs)
    finally:
        for _, dl in quiet:
            dl.use_stateful_dataloader = True


def _own_or_shared(dl: Any, own: Any, loaded: list[bool], shared: Any) -> None:
    """Load this rank's own state in place of the shared one, where they are at one place."""
    same = isinstance(shared, dict) and isinstance(own, dict) and all(
        own.get(k) == shared.get(k) for k in _PLACE)
    loaded.append(True)
    type(dl).load_state_dict(dl, own if same else shared)


def _load(original: Any, bound: inspect.BoundArguments) -> Any:
    import torch

    args = bound.arguments
    swapped: list[tuple[Any, Any, list[bool]]] = []
    for i, dl in _stateful_stoker(args.get("dataloaders")):
        path = _own_file(args["input_dir"], i, args["process_index"])
        if path.exists():
            own = torch.load(path, weights_only=False)  # written by _save
            loaded: list[bool] = []
            dl.load_state_dict = functools.partial(_own_or_shared, dl, own, loaded)
            swapped.append((dl, own, loaded))
    try:
        result = original(*bound.args, **bound.kwargs)
    finally:
        for dl, _, _ in swapped:
            del dl.load_state_dict
    for dl, own, loaded in swapped:
        if not loaded:  # no shared file (another node's disk): this rank's own is the state
            dl.load_state_dict(own)
    return result


def install(module: ModuleType) -> None:
    """Wrap ``module``'s save and load functions and their bindings in
    ``accelerate.accelerator`` (once)."""
    for name, step in ((_SAVE, _save), (_LOAD, _load)):
        original = getattr(module, name, None)
        if original is None or getattr(original, "__stoker_wrapped__", False):
            continue
        wrapped = _wrapper(original, step)
        setattr(module, name, wrapped)
        for binder in _BINDERS:
            mod = sys.modules.get(binder)
            if mod is not None and getattr(mod, name, None) is original:
                setattr(mod, name, wrapped)


def _wrapper(original: Any, step: Any) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return step(original, signature.bind(*args, **kwargs))

    wrapper.__stoker_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper
