"""The memory watch's suspect: the largest Python container a dataset holds (a list of
paths, a dict of labels), named with its path, its kind and its estimated size."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from stoker._core.walk import attributes

_WALK_DEPTH = 2  # dataset -> .dataset / .datasets[i] -> their attributes' objects
_WALK_MAX_OBJECTS = 256
_SIZE_SAMPLES = 16

_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
_NOT_WALKED = (type, type(sys), type(len), type(lambda: None))


@dataclass(frozen=True)
class ContainerFinding:
    path: str  # from the dataset, e.g. "dataset.dataset.paths"
    kind: str  # e.g. "list[str]", "dict[str, int]", "ndarray[object]"
    length: int
    est_bytes: int
    owner: str  # class name of the object holding the attribute
    attr: str  # the attribute's name on that object
    container: str  # "list", "dict", "ndarray", ...
    elem: str  # element type name ("str", "bytes", ... or "object" when mixed)


def find_largest_python_container(dataset: Any) -> tuple[str, str, int] | None:
    """``(attr_path, kind, est_bytes)`` of the largest Python container reachable from the
    dataset's attributes (two levels deep: through ``Subset.dataset``, ``ConcatDataset.datasets``
    and similar), or None if it holds none. Sizes are estimates: ``len`` x the mean deep size
    of a few elements."""
    finding = largest_container(dataset)
    return None if finding is None else (finding.path, finding.kind, finding.est_bytes)


def largest_container(dataset: Any) -> ContainerFinding | None:
    found: list[ContainerFinding] = []
    _walk(dataset, "dataset", 0, set(), found)
    return max(found, key=lambda f: f.est_bytes, default=None)


def _walkable(obj: Any) -> bool:
    if isinstance(obj, _NOT_WALKED):  # classes, modules, functions
        return False
    return hasattr(obj, "__dict__") or bool(getattr(type(obj), "__slots__", ()))


def _walk(obj: Any, path: str, depth: int, seen: set[int], found: list[ContainerFinding]) -> None:
    if id(obj) in seen or len(seen) >= _WALK_MAX_OBJECTS:
        return
    seen.add(id(obj))
    try:
        attrs = attributes(obj)
    except Exception:  # a property or __getattr__ that raises: nothing to learn here
        return
    for name, value in attrs.items():
        sub = f"{path}.{name}"
        try:
            finding = _describe(value, sub, type(obj).__qualname__, name)
        except Exception:  # an odd container (len() or iteration raises): skip it
            continue
        if finding is not None:
            found.append(finding)
        if depth >= _WALK_DEPTH:
            continue
        if isinstance(value, (list, tuple)):  # e.g. ConcatDataset.datasets
            for i, item in enumerate(value[:8]):
                if _walkable(item):
                    _walk(item, f"{sub}[{i}]", depth + 1, seen, found)
        elif finding is None and _walkable(value):
            _walk(value, sub, depth + 1, seen, found)


def _is_object_array(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray) and value.dtype == object


def _describe(value: Any, path: str, owner: str, attr: str) -> ContainerFinding | None:
    if isinstance(value, _CONTAINERS):
        container = type(value).__name__
        items = value.items() if isinstance(value, dict) else value
    elif _is_object_array(value):
        container, items = "ndarray", value.ravel()
    else:
        return None
    n = len(items)
    sample = _spread_sample(items, n)
    if isinstance(value, dict):
        keys = _type_name(k for k, _ in sample)
        elem = _type_name(v for _, v in sample)
        kind = f"dict[{keys}, {elem}]" if sample else "dict"
        sizes = [_deep_size(k, 1) + _deep_size(v, 1) for k, v in sample]
    else:
        elem = _type_name(sample)
        kind = (
            f"{container}[{'object' if container == 'ndarray' else elem}]" if sample else container
        )
        sizes = [_deep_size(x, 1) for x in sample]
    est = sys.getsizeof(value) + (n * sum(sizes) // len(sizes) if sizes else 0)
    return ContainerFinding(path, kind, n, est, owner, attr, container, elem)


def _spread_sample(items: Any, n: int) -> list[Any]:
    if n == 0:
        return []
    if isinstance(items, (list, tuple)) or _is_object_array(items):
        step = max(1, n // _SIZE_SAMPLES)
        return [items[i] for i in range(0, n, step)][:_SIZE_SAMPLES]
    return list(islice(items, _SIZE_SAMPLES))


def _type_name(values: Iterable[Any]) -> str:
    names = {type(v).__name__ for v in values}
    return names.pop() if len(names) == 1 else "object"


def _deep_size(x: Any, depth: int) -> int:
    """``sys.getsizeof`` of ``x`` plus, ``depth`` levels down, its items (estimated from a
    few) or an object's attribute dict."""
    size = sys.getsizeof(x)
    if depth <= 0 or isinstance(x, (str, bytes, bytearray)):
        return size
    if isinstance(x, dict):
        pairs = list(islice(x.items(), _SIZE_SAMPLES))
        sizes = [_deep_size(k, depth - 1) + _deep_size(v, depth - 1) for k, v in pairs]
    elif isinstance(x, _CONTAINERS):
        sizes = [_deep_size(p, depth - 1) for p in islice(x, _SIZE_SAMPLES)]
    elif isinstance(getattr(x, "__dict__", None), dict):  # an object: its attribute values
        attrs = vars(x)  # (the names are interned strings, shared by every instance)
        values = [_deep_size(v, depth - 1) for v in islice(attrs.values(), _SIZE_SAMPLES)]
        size += sys.getsizeof(attrs)
        return size + (len(attrs) * sum(values) // len(values) if values else 0)
    else:
        return size
    return size + (len(x) * sum(sizes) // len(sizes) if sizes else 0)
