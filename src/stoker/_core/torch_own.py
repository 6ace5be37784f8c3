"""Whether a function is torch's own: the one torch's module defines under that name.

NOTE [ torch's own functions ]
A fast path may replace torch's code only where that code is torch's: a program can rebind a
module's function (``torch.utils.data._utils.collate.default_collate = mine``) or a class's
method (``RandomSampler.__iter__ = mine``), and torch then calls the program's version. An
identity check against a reference taken at import misses a rebinding made before stoker was
imported, and ``__module__``/``__qualname__`` are what ``functools.wraps`` copies onto a
wrapper. The code object is not: torch's function has its code in that module's file, under
that name, and a program's wrapper has its own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = ["torchs_own"]


def torchs_own(fn: Any, module: ModuleType, name: str) -> bool:
    """``fn`` (a function, or a property's getter) is the ``name`` torch's ``module`` defines."""
    if isinstance(fn, property):
        fn = fn.fget
    fn = getattr(fn, "__func__", fn)  # a classmethod or staticmethod read from the class dict
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_name == name and code.co_filename == module.__file__
