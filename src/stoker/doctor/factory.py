"""``MODULE:FUNCTION`` arguments of the commands (``stoker pack``, ``stoker doctor``).

An error in the user's code (their module's import, their function) is shown as the user's
own error: its traceback from the user's first frame (stoker's and importlib's frames before
it left out), then one line naming what raised it (``UserCodeFailed``)."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

# the stoker package's directory (this file is stoker/doctor/factory.py)
_STOKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class UserCodeFailed(Exception):
    """The user's module or function raised; ``traceback_text`` is its traceback, from the
    user's first frame, and the message says what raised it."""

    def __init__(self, message: str, exc: BaseException) -> None:
        super().__init__(message)
        self.traceback_text = users_traceback(exc)


_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep


def _not_users(filename: str) -> bool:
    return filename.startswith((_STOKER_DIR, _IMPORTLIB_DIR, "<frozen importlib"))


def users_traceback(exc: BaseException) -> str:
    """``exc`` formatted as Python prints it, its traceback starting at the first frame that is
    neither stoker's nor importlib's (whole, when every frame is)."""
    tb = exc.__traceback__
    while tb is not None and _not_users(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def call_factory(factory: Callable[[], Any], spec: str) -> Any:
    """``factory()``; ``UserCodeFailed`` when it raises."""
    try:
        return factory()
    except Exception as exc:
        raise UserCodeFailed(
            f"{spec} raised the {type(exc).__name__} above; fix it and run the same command "
            "again.", exc) from exc


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
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        dotted = os.path.splitext(module_name)[0].replace(os.sep, ".").replace("/", ".")
        raise ValueError(
            f"{spec!r}: {module_name!r} is a file path; name its module, as for `python -m`: "
            f"'{dotted.strip('.')}:{attr}' (run from the directory the module is imported "
            "from)."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{spec!r}: cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:  # the user's module raised as it was imported
        raise UserCodeFailed(
            f"{spec}: importing {module_name!r} raised the {type(exc).__name__} above; fix it "
            "and run the same command again.", exc) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        functions = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(attr, functions, n=1)
        hint = f" Did you mean '{module_name}:{close[0]}'?" if close else ""
        raise ValueError(
            f"{spec!r}: module {module_name!r} has no function {attr!r}; expected a function "
            f"returning {returns}.{hint}"
        )
    return factory
