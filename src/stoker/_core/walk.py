"""Walk a dataset's attributes (a few levels, through Subset/ConcatDataset/tuples of tensors)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_MAX_OBJECTS = 2000
_MAX_ITEMS = 16


def attributes(obj: Any) -> dict[str, Any]:
    """An object's instance attributes: its ``__dict__`` and its ``__slots__`` values."""
    attrs = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in attrs:
                try:
                    attrs[name] = getattr(obj, name)
                except AttributeError:
                    pass
    return attrs


def iter_attributes(
    root: Any, root_name: str = "dataset", depth: int = 2
) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, value)`` for the attributes of ``root`` and of the objects they hold.

    Lists and tuples are looked into (their first items), so ``ConcatDataset.datasets[1]`` and
    ``TensorDataset.tensors[0]`` are reached. Bounded: at most ``_MAX_OBJECTS`` objects.
    """
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = [(root_name, root, 0)]
    while stack and len(seen) < _MAX_OBJECTS:
        path, obj, level = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        try:
            attrs = attributes(obj)
        except Exception:  # a property or __getattr__ that raises: nothing to learn here
            continue
        for name, value in attrs.items():
            sub = f"{path}.{name}"
            yield sub, value
            if level >= depth:
                continue
            if isinstance(value, (list, tuple)):
                for i, item in enumerate(value[:_MAX_ITEMS]):
                    yield f"{sub}[{i}]", item
                    stack.append((f"{sub}[{i}]", item, level + 1))
            elif hasattr(value, "__dict__") or bool(getattr(type(value), "__slots__", None)):
                stack.append((sub, value, level + 1))
