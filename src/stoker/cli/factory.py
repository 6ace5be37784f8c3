"""``MODULE:FUNCTION`` arguments of the commands (``stoker pack``, ``stoker doctor``)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


def import_factory(spec: str, returns: str) -> Callable[[], Any]:
    """The function named by ``spec``; the working directory is importable, as for
    ``python -m``. ``returns`` completes the error messages ("a function returning ...").
    Raises ValueError saying which half of the spec failed."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"{spec!r}: expected MODULE:FUNCTION, a function returning {returns}, "
            "e.g. 'train:make_loader'."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{spec!r}: cannot import module {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(
            f"{spec!r}: module {module_name!r} has no function {attr!r}; expected a function "
            f"returning {returns}."
        )
    return factory
