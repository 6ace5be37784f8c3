"""Torch modes that count what they see: a program's ``TorchFunctionMode`` or
``TorchDispatchMode`` active while it iterates, for the tests that compare it under torch's
loader and stoker's (the differential fuzzer's ``torch_mode`` op, ``_modes_probe.py``).

A mode sees every torch call made on its thread (and a worker forked while it is active
starts with it): under torch's DataLoader, torch's own calls (NOTE [ The program's torch modes
see torch's calls ]).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["MODES", "counting_mode"]


class _Functions(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[getattr(func, "__qualname__", None) or str(func)] += 1
        return func(*args, **(kwargs or {}))


class _Operators(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen[str(func)] += 1
        return func(*args, **(kwargs or {}))


MODES = ("function", "dispatch")


def counting_mode(kind: str) -> Any:
    """A new counting mode of ``kind`` (one of ``MODES``); its ``seen`` is what it counted."""
    return _Functions() if kind == "function" else _Operators()
