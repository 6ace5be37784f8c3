"""Run a hook the moment a module has been imported, without importing the hook's module
before then (NOTE [ Import only what the loader needs ]).

``import stoker`` must teach Accelerate to keep stoker's engine (NOTE [ Accelerate keeps
stoker ]) the moment ``accelerate.data_loader`` runs, before any ``from .data_loader import``
binds its functions elsewhere, yet must not import ``stoker.integrations`` in a script that
never imports Accelerate. ``when_imported`` runs the hook (named as ``"module:function"``) at
once when the watched module is already loaded, else right after the module's body has run.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


def _run(hook: str, module: ModuleType) -> None:
    where, _, name = hook.partition(":")
    getattr(importlib.import_module(where), name)(module)


class _Watch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the watched name it returns the path finder's spec with the
    loader's ``exec_module`` wrapped to run the hook after the module's body."""

    def __init__(self, target: str, hook: str) -> None:
        self.target, self.hook = target, hook

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        hook = self.hook

        def exec_and_run(module: ModuleType) -> None:
            exec_module(module)
            _run(hook, module)

        spec.loader.exec_module = exec_and_run  # type: ignore[method-assign]
        return spec


def when_imported(target: str, hook: str) -> None:
    """Call ``hook`` (``"package.module:function"``) with module ``target`` once it is
    imported: now if it is, else when its body has run. Watching twice is harmless."""
    if target in sys.modules:
        _run(hook, sys.modules[target])
    elif not any(isinstance(f, _Watch) and (f.target, f.hook) == (target, hook)
                 for f in sys.meta_path):
        sys.meta_path.insert(0, _Watch(target, hook))
