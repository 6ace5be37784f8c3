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
    """Finds nothing itself: for a watched name it returns the path finder's spec with the
    loader's ``exec_module`` wrapped to run the hooks after the module's body. One finder for
    every watch (a program sees one entry more in ``sys.meta_path``, where torch adds none),
    which forgets a name once its hooks ran and leaves ``sys.meta_path`` when none is left."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[str]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_run(module: ModuleType) -> None:
            # Forgotten here, not when the spec is found: ``importlib.util.find_spec(name)``
            # (a check that a package is installed) finds a spec that no import may run.
            hooks = self.hooks.pop(fullname, [])
            if not self.hooks and self in sys.meta_path:
                sys.meta_path.remove(self)
            exec_module(module)
            for hook in hooks:
                _run(hook, module)

        spec.loader.exec_module = exec_and_run  # type: ignore[method-assign]
        return spec


_WATCH = _Watch()


def when_imported(target: str, hook: str) -> None:
    """Call ``hook`` (``"package.module:function"``) with module ``target`` once it is
    imported: now if it is, else when its body has run. Watching twice is harmless."""
    if target in sys.modules:
        _run(hook, sys.modules[target])
        return
    hooks = _WATCH.hooks.setdefault(target, [])
    if hook not in hooks:
        hooks.append(hook)
    if _WATCH not in sys.meta_path:
        sys.meta_path.insert(0, _WATCH)
