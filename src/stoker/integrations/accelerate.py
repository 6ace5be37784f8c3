"""Accelerate (and so Hugging Face ``Trainer``) keeps a stoker loader's engine.

NOTE [ Accelerate keeps stoker ]
``accelerator.prepare(loader)`` and ``accelerate.skip_first_batches(loader, n)`` rebuild a
DataLoader: they wrap it in a ``DataLoaderShard`` (or ``DataLoaderDispatcher``) whose
``base_dataloader`` is a new ``torch.utils.data.DataLoader`` built from the old one's torch
arguments and a sharded batch sampler. For a stoker loader that new loader would be torch's:
every stoker argument gone, ``stats()`` at zero, no warning. stoker therefore wraps those two
functions of ``accelerate.data_loader`` as soon as that module is imported (``install``, run
by the import watch ``import stoker`` sets, ``_core/import_watch.py``, or at once when
Accelerate was imported first; this module itself loads only then): the wrapped
functions run Accelerate's own code unchanged, then, when the input was a stoker loader, build
the base loader again as a ``stoker.DataLoader`` with the very arguments Accelerate chose
(dataset, sharded batch sampler, workers, collate) plus the original's stoker arguments. Any
other loader is returned exactly as Accelerate built it. Where the result has no base loader
to replace (a wrapper this module does not know, e.g. XLA's), a one-time warning says the
loader now runs on torch's DataLoader and what to do: the engine is never bypassed silently.

Those two functions may also run unwrapped (imported by name before ``import stoker``), so
every ``DataLoaderAdapter`` Accelerate builds checks too. It is built from a dataset, and a
dataset says nothing of the loader it came from: a torch loader the user built over the
dataset of a stoker loader (an evaluation loader, say) must stay torch's, and two stoker
loaders over one dataset keep their own arguments. So the adapter asks which loader is being
rebuilt: the ``dataloader`` argument of the innermost of those two functions on the stack
(found by their code objects), and only a stoker loader there (or an adapter over one) is
rebuilt as a stoker loader. An adapter built outside them is left as built.

``shard=True`` is dropped from the rebuilt loader: Accelerate's batch sampler already gives
each process its share, and stoker's sharding on top would split it again.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from types import CodeType, FrameType, ModuleType
from typing import Any

import torch.utils.data

_TARGET = "accelerate.data_loader"
_WRAPPED = ("prepare_data_loader", "skip_first_batches")
# Modules that bind Accelerate's functions by name (``from .data_loader import ...``).
_BINDERS = (
    "accelerate", "accelerate.accelerator", "accelerate.data_loader", "transformers.trainer",
)
_warned: set[str] = set()
# The code of Accelerate's functions in _WRAPPED, unwrapped: how an adapter finds their frames.
_rebuilder_codes: set[CodeType] = set()


def _being_rebuilt() -> Any:
    """The loader Accelerate's ``prepare_data_loader`` / ``skip_first_batches`` is rebuilding
    (their ``dataloader`` argument, read from the innermost of their frames), or None outside
    them."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code in _rebuilder_codes:
            return frame.f_locals.get("dataloader")
        frame = frame.f_back
    return None


def stoker_source(loader: Any) -> Any:
    """The stoker loader behind ``loader`` (itself, or an Accelerate wrapper's base), or None."""
    from stoker.loader import DataLoader

    for candidate in (loader, _base_of(loader)):
        if candidate is not None and isinstance(type(candidate), type) and issubclass(
            type(candidate), DataLoader
        ):
            return candidate
    return None


def _base_of(loader: Any) -> Any:
    try:
        return object.__getattribute__(loader, "base_dataloader")
    except AttributeError:
        return None


def rebuilt(source: Any, base: torch.utils.data.DataLoader) -> Any:
    """A ``stoker.DataLoader`` with ``base``'s torch arguments and ``source``'s stoker ones."""
    from stoker.loader import DataLoader

    kwargs: dict[str, Any] = {
        name: getattr(base, name)
        for name in ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                     "multiprocessing_context", "generator", "prefetch_factor",
                     "persistent_workers", "pin_memory_device", "in_order")
    }
    if base.batch_size is None and base._auto_collation:  # built with batch_sampler=
        kwargs["batch_sampler"] = base.batch_sampler
    else:
        kwargs.update(batch_size=base.batch_size, drop_last=base.drop_last)
        if not isinstance(base.dataset, torch.utils.data.IterableDataset):
            kwargs["sampler"] = base.sampler
    for name in stoker_arguments():
        kwargs[name] = getattr(source, name)
    kwargs["shard"] = False  # Accelerate's batch sampler already shards
    return DataLoader(base.dataset, **kwargs)


@functools.cache
def stoker_arguments() -> tuple[str, ...]:
    """stoker.DataLoader's constructor arguments that torch's DataLoader does not have."""
    from stoker.loader import DataLoader

    ours = inspect.signature(DataLoader.__init__).parameters
    torch_own = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    return tuple(name for name in ours if name not in torch_own)


def adopt(source: Any, prepared: Any, what: str) -> Any:
    """Put a stoker loader under what Accelerate returned for ``source``."""
    if type(prepared) is torch.utils.data.DataLoader:
        return rebuilt(source, prepared)
    base = _base_of(prepared)
    if isinstance(base, torch.utils.data.DataLoader) and stoker_source(base) is None:
        prepared.base_dataloader = rebuilt(source, base)
        if hasattr(prepared, "dl_state_dict"):
            prepared.dl_state_dict = prepared.base_dataloader.state_dict()
        return prepared
    if stoker_source(prepared) is None:
        warn_bypassed(what, type(prepared).__name__)
    return prepared


def warn_bypassed(what: str, got: str) -> None:
    """Once per call site kind: stoker's engine no longer runs under this loader."""
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(
        f"{what} replaced a stoker.DataLoader with Accelerate's {got}, which stoker cannot "
        "rebuild: batches now come from torch's DataLoader, without stoker's engine "
        "(loader.stats() stays at 0). Iterate the stoker loader yourself (skip "
        "accelerator.prepare for it and move batches with accelerator.device), or report "
        "this Accelerate version to stoker.",
        RuntimeWarning,
        stacklevel=3,
    )


def _wrap(original: Any, what: str) -> Any:
    if getattr(original, "__stoker_wrapped__", False):
        return original

    @functools.wraps(original)
    def wrapper(dataloader: Any, *args: Any, **kwargs: Any) -> Any:
        prepared = original(dataloader, *args, **kwargs)
        source = stoker_source(dataloader)
        return prepared if source is None else adopt(source, prepared, what)

    wrapper.__stoker_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _generator_states(kwargs: dict[str, Any]) -> list[tuple[torch.Generator, torch.Tensor]]:
    """The generators an adapter's base loader may draw from as it is built, with their states.

    Under ``use_stateful_dataloader=True`` Accelerate builds a torchdata ``StatefulDataLoader``
    and calls its ``state_dict()``, which starts its first iterator: a base seed drawn from the
    loader's generator (or torch's global one). That loader is replaced by a stoker one, which
    draws its own at its first ``iter()``; restoring the generators makes that draw the one
    torchdata's first epoch had (the same permutation), not the one after it."""
    batch_sampler = kwargs.get("batch_sampler")
    holders = [kwargs, batch_sampler, kwargs.get("sampler"),
               getattr(batch_sampler, "sampler", None), getattr(batch_sampler, "batch_sampler",
                                                              None)]
    holders.append(getattr(holders[-1], "sampler", None))
    found: dict[int, torch.Generator] = {}
    if kwargs.get("generator") is None:  # the base seed is drawn from the global generator
        found[id(torch.default_generator)] = torch.default_generator
    for holder in holders:
        generator = holder.get("generator") if isinstance(holder, dict) else getattr(
            holder, "generator", None)
        if isinstance(generator, torch.Generator):
            found[id(generator)] = generator
    return [(g, g.get_state()) for g in found.values()]


def _hook_adapter(adapter_cls: Any) -> None:
    """Every ``DataLoaderAdapter`` (``DataLoaderShard``, ``DataLoaderDispatcher``,
    ``SkipDataLoader``) Accelerate builds from a stoker loader gets a stoker base loader, however
    the function that built it was imported; any other keeps Accelerate's."""
    init = adapter_cls.__init__
    if getattr(init, "__stoker_wrapped__", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
        source = stoker_source(_being_rebuilt())  # NOTE [ Accelerate keeps stoker ]
        before = _generator_states(kwargs) if source is not None else []
        init(self, dataset, *args, **kwargs)
        if source is not None:
            adopt(source, self, f"accelerate's {type(self).__name__}")
            for generator, state in before:
                generator.set_state(state)  # what torchdata's base loader drew, undrawn

    __init__.__stoker_wrapped__ = True  # type: ignore[attr-defined]
    adapter_cls.__init__ = __init__


def install(module: ModuleType) -> None:
    """Wrap ``module``'s (``accelerate.data_loader``) functions and every binding of them."""
    adapter = getattr(module, "DataLoaderAdapter", None)
    if adapter is not None:
        _hook_adapter(adapter)
    for name in _WRAPPED:
        original = getattr(module, name, None)
        if original is None:
            warn_bypassed(f"accelerate.{name}", "(missing function)")
            continue
        _rebuilder_codes.add(inspect.unwrap(original).__code__)
        wrapped = _wrap(original, f"accelerate's {name}()")
        for binder in _BINDERS:
            mod = sys.modules.get(binder)
            if mod is not None and getattr(mod, name, None) is original:
                setattr(mod, name, wrapped)
        setattr(module, name, wrapped)
