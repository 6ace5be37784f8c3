"""The loader under examination, as a recipe the doctor can rebuild with other settings.

A factory named ``module:function`` returns either a loader (stoker's or torch's) or
``(dataset, kwargs)``; either way the doctor keeps the dataset and the constructor arguments,
and builds ``stoker.DataLoader(dataset, **{**kwargs, **overrides})`` for each candidate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.utils.data

# stoker's own keyword arguments, read back from a stoker loader's attributes.
_STOKER_ATTRS = ("worker_type", "worker_concurrency", "seeding", "on_error", "skip_budget",
                 "device", "device_prefetch", "device_transform")


class TargetError(ValueError):
    """The factory could not be found or returned something the doctor cannot use."""


@dataclass(frozen=True)
class Recipe:
    dataset: Any
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # what the user named, for the report

    def build(self, overrides: Mapping[str, Any] | None = None) -> Any:
        from stoker import DataLoader

        return DataLoader(self.dataset, **self.merged(overrides))

    def merged(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        kwargs = {**self.kwargs, **(overrides or {})}
        if kwargs.get("num_workers", 0) == 0:
            # torch refuses these without workers; a candidate with none drops them.
            for key in ("prefetch_factor", "persistent_workers"):
                kwargs.pop(key, None)
        return kwargs


def load_recipe(spec: str) -> Recipe:
    """``module:function`` (the current directory is importable, as for ``python -m``)."""
    from stoker.cli.factory import call_factory, import_factory

    try:
        factory = import_factory(spec, "your DataLoader or (dataset, loader_kwargs)")
    except ValueError as exc:
        raise TargetError(str(exc)) from exc
    return recipe_of(call_factory(factory, spec), spec)  # UserCodeFailed when it raises


def recipe_of(made: Any, source: str = "") -> Recipe:
    if isinstance(made, torch.utils.data.DataLoader):
        return Recipe(made.dataset, kwargs_of(made), source)
    if (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], Mapping)):
        return Recipe(made[0], dict(made[1]), source)
    raise TargetError(
        f"{source or 'the factory'} returned {type(made).__name__}; expected a DataLoader "
        "(stoker's or torch's) or a (dataset, loader_kwargs) pair."
    )


def kwargs_of(loader: Any) -> dict[str, Any]:
    """The constructor arguments that rebuild ``loader`` (its sampler objects reused)."""
    from torch.utils.data._utils.collate import default_collate, default_convert

    kwargs: dict[str, Any] = {}
    if loader.batch_size is not None:
        kwargs.update(batch_size=loader.batch_size, sampler=loader.sampler,
                      drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    if loader.collate_fn not in (default_collate, default_convert) and not _stokers(
        loader.collate_fn
    ):
        kwargs["collate_fn"] = loader.collate_fn
    kwargs["num_workers"] = loader.num_workers
    for name in ("pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                 "generator", "persistent_workers", "in_order"):
        kwargs[name] = getattr(loader, name)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    for name in _STOKER_ATTRS:
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    if kwargs.get("device") is None:  # no device feed: leave its arguments out
        for name in ("device", "device_prefetch", "device_transform"):
            kwargs.pop(name, None)
    return kwargs


def _stokers(fn: Any) -> bool:
    return getattr(fn, "__module__", "").startswith("stoker.collate")
