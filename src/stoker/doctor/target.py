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

from stoker.doctor.loader_kwargs import kwargs_of


class TargetError(ValueError):
    """The factory could not be found or returned something the doctor cannot use."""


@dataclass(frozen=True)
class Recipe:
    dataset: Any
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # what the user named, for the report

    def build(self, overrides: Mapping[str, Any] | None = None) -> Any:
        from stoker.loader import DataLoader

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
    from stoker.doctor.factory import call_factory, import_factory

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
