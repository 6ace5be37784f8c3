"""A package's public names, imported the first time they are read (PEP 562).

NOTE [ Import only what the loader needs ]
``import stoker`` follows ``import torch`` in every training script, so reading
``stoker.DataLoader`` loads the loader and what building one needs, and nothing else: record
formats, storage, image helpers, the device feed, the worker side and the process engine load
when first used (issue 35; measured by ``benchmarks/import_time.py``, kept by
``tests/integration/test_lazy_imports.py``). ``import stoker`` itself loads no torch (issue
48): the ``stoker`` command parses its arguments, ``--help`` and ``--version`` without it. A package
that re-exports names from its modules lists them in a table (name -> module) and gets its
``__getattr__`` and ``__dir__`` here, so ``from stoker import Mix``, ``stoker.formats.TarShards``
and ``dir(stoker)`` behave as if the names were imported at the top; an ``if TYPE_CHECKING:``
block beside the table gives type checkers and IDEs the same names. A name is imported once,
then kept in the package's namespace like any other.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``table[name]`` is the module ``name``
    is read from; a name that is a module of ``package`` itself maps to ``""``."""

    def __getattr__(name: str) -> Any:
        source = table.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if not source:  # a submodule: importing it binds it in the package
            return importlib.import_module(f"{package}.{name}")
        value = getattr(importlib.import_module(source), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
