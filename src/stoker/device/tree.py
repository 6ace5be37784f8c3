"""Rebuild a batch with some of its leaves replaced, walking containers as torch's pin thread
does (Mapping, namedtuple, tuple, Sequence; str and bytes are leaves)."""

from __future__ import annotations

import collections.abc
import copy
from collections.abc import Callable
from typing import Any


def map_batch(data: Any, leaf: Callable[[Any], Any], is_leaf: Callable[[Any], bool]) -> Any:
    """``data`` with every ``is_leaf`` item replaced by ``leaf(item)``; containers are copied
    (same type where it can be rebuilt, as torch's ``pin_memory`` does), the rest kept."""
    if is_leaf(data):
        return leaf(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        mapped = {k: map_batch(v, leaf, is_leaf) for k, v in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(mapped)
                return clone
            return type(data)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(map_batch(v, leaf, is_leaf) for v in data))
        return type(data)(map_batch(v, leaf, is_leaf) for v in data)
    if isinstance(data, collections.abc.Sequence):
        items = [map_batch(v, leaf, is_leaf) for v in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone_seq = copy.copy(data)
                for i, item in enumerate(items):
                    clone_seq[i] = item
                return clone_seq
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data


def iter_tensors(data: Any, path: str = "batch") -> Any:
    """``(path, tensor)`` for every tensor of a batch, in walk order."""
    import torch

    if isinstance(data, torch.Tensor):
        yield path, data
    elif isinstance(data, (str, bytes)):
        return
    elif isinstance(data, collections.abc.Mapping):
        for k, v in data.items():
            yield from iter_tensors(v, f"{path}[{k!r}]")
    elif isinstance(data, collections.abc.Sequence):
        for i, v in enumerate(data):
            yield from iter_tensors(v, f"{path}[{i}]")
