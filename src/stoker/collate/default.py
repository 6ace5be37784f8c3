"""``collate``, ``default_collate`` and ``default_convert``: torch's semantics, our code.

NOTE [ Collate compatibility with torch ]
Results (values, dtypes, container and namedtuple types) and errors (types and messages) are
those of ``torch.utils.data.default_collate`` as run in the main process, for every input.
Structure is walked the way torch walks it: a map lookup by exact type, then ``isinstance``
over the map's keys in insertion order, then Mapping, namedtuple, Sequence. Things to know:

* tuples come back as lists, except namedtuples; str/bytes come back as the sequence they
  were gathered in (the batch itself at top level, a tuple under a list/tuple sample);
* a user map may be torch's own ``default_collate_fn_map`` or extend it: torch's stock leaf
  functions are swapped for ours (same results, our fast paths); any other function in the map
  is called as given, so a user's function for a type always wins;
* when a container type refuses copy/update/construction (``TypeError``), torch falls back to
  a plain dict/list and collates the values a second time; we collate them once and reuse
  them, so a user's collate function never runs twice for one node.

Leaf functions and their fast paths (allocator, numpy, Python numbers) live in ``_leaves``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils import collate as _torch_collate

from stoker.collate import _leaves
from stoker.collate._leaves import ERR_MSG_FORMAT, CollateFnMap

__all__ = [
    "collate",
    "default_collate",
    "default_collate_err_msg_format",
    "default_collate_fn_map",
    "default_convert",
]

default_collate_err_msg_format = ERR_MSG_FORMAT


def collate_numpy_array_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Numeric ndarrays -> one tensor; str/bytes/object arrays are an error, as in torch."""
    elem = batch[0]
    if _leaves.is_str_or_object(elem.dtype):
        raise TypeError(ERR_MSG_FORMAT.format(elem.dtype))
    if _leaves.stacks_as_tensors(collate_fn_map):
        out = _leaves.stack_arrays(batch, elem)
        if out is not None:
            return out
    return collate([torch.as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


# Same keys, in the same order, as torch's map: the isinstance scan's order is part of the
# semantics (np.float64 is a float, but is collated as a numpy scalar).
default_collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] = {
    torch.Tensor: _leaves.collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    (np.bool_, np.number, np.object_): _leaves.collate_numpy_scalar_fn,
    float: _leaves.collate_float_fn,
    int: _leaves.collate_int_fn,
    str: _leaves.collate_str_fn,
    bytes: _leaves.collate_str_fn,
}

# id(torch's stock function) -> ours. Keyed by id: a map value need not be hashable.
_OURS_FOR_TORCH: dict[int, Callable[..., Any]] = {
    id(getattr(_torch_collate, fn.__name__, fn)): fn
    for fn in (
        _leaves.collate_tensor_fn,
        collate_numpy_array_fn,
        _leaves.collate_numpy_scalar_fn,
        _leaves.collate_float_fn,
        _leaves.collate_int_fn,
        _leaves.collate_str_fn,
    )
}
_MISSING: Any = object()


def default_collate(batch: Sequence[Any]) -> Any:
    """Drop-in for ``torch.utils.data.default_collate``: ``collate`` with our default map."""
    return collate(batch, collate_fn_map=default_collate_fn_map)


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Drop-in for ``torch.utils.data._utils.collate.collate``.

    ``collate_fn_map`` maps a type (or tuple of types) to ``fn(batch, *, collate_fn_map)``;
    it is consulted by exact type of ``batch[0]``, then by ``isinstance`` in insertion order.
    """
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        fn = collate_fn_map.get(elem_type, _MISSING)
        if fn is _MISSING:
            fn = _first_instance_fn(collate_fn_map, elem)
        if fn is not _MISSING:
            return _OURS_FOR_TORCH.get(id(fn), fn)(batch, collate_fn_map=collate_fn_map)
    # Exact builtins first: cheaper than the ABC checks, and what torch's branches give them.
    if elem_type is dict:
        return _collate_values(batch, elem, collate_fn_map)
    if elem_type is list or elem_type is tuple:
        return _collate_columns(_transpose(batch), collate_fn_map)
    if isinstance(elem, Mapping):
        return _collate_mapping(batch, elem, collate_fn_map)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple: no length check
        return elem_type(*_collate_columns(zip(*batch, strict=False), collate_fn_map))
    if isinstance(elem, Sequence):
        return _collate_sequence(batch, elem, collate_fn_map)
    raise TypeError(ERR_MSG_FORMAT.format(elem_type))


def _first_instance_fn(collate_fn_map: CollateFnMap, elem: Any) -> Any:
    for key in collate_fn_map:
        if isinstance(elem, key):
            return collate_fn_map[key]
    return _MISSING


def _collate_columns(columns: Any, collate_fn_map: CollateFnMap | None) -> list[Any]:
    return [collate(column, collate_fn_map=collate_fn_map) for column in columns]


def _transpose(batch: Sequence[Any]) -> list[tuple[Any, ...]]:
    it = iter(batch)
    size = len(next(it))
    # Lazy, so it stops at the first mismatch exactly where torch's check does.
    if not all(map(size.__eq__, map(len, it))):
        raise RuntimeError("each element in list of batch should be of equal size")
    return list(zip(*batch, strict=False))


def _collate_mapping(
    batch: Sequence[Any], elem: Mapping[Any, Any], collate_fn_map: CollateFnMap | None
) -> Any:
    return _rebuild_mapping(elem, lambda: _collate_values(batch, elem, collate_fn_map))


def _collate_values(
    batch: Sequence[Any], elem: Mapping[Any, Any], collate_fn_map: CollateFnMap | None
) -> dict[Any, Any]:
    return {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem}


def _collate_sequence(
    batch: Sequence[Any], elem: Sequence[Any], collate_fn_map: CollateFnMap | None
) -> Any:
    columns = _transpose(batch)
    if isinstance(elem, tuple):
        return _collate_columns(columns, collate_fn_map)
    return _rebuild_sequence(elem, lambda: _collate_columns(columns, collate_fn_map))


def _rebuild(
    elem: Any, values: Callable[[], Any], mutable: bool, fill: Callable[[Any, Any], None]
) -> Any:
    """A container of ``elem``'s type holding ``values()``; ``values()`` itself when it refuses.

    A mutable container is copied and filled in place, since its type may carry state
    (defaultdict's factory, attributes) that ``type(elem)(...)`` would lose.
    """
    if mutable:
        try:
            clone = copy.copy(elem)
        except TypeError:
            return values()
        result = values()
        try:
            fill(clone, result)
        except TypeError:
            return result
        return clone
    result = values()
    try:
        return type(elem)(result)
    except TypeError:
        return result


def _update(clone: Any, values: dict[Any, Any]) -> None:
    clone.update(values)


def _assign_items(clone: Any, values: list[Any]) -> None:
    for i, value in enumerate(values):
        clone[i] = value


def _rebuild_mapping(elem: Mapping[Any, Any], values: Callable[[], dict[Any, Any]]) -> Any:
    """A mapping of ``elem``'s type holding ``values()``; a plain dict when the type refuses."""
    return _rebuild(elem, values, isinstance(elem, MutableMapping), _update)


def _rebuild_sequence(elem: Sequence[Any], values: Callable[[], list[Any]]) -> Any:
    """A sequence of ``elem``'s type holding ``values()``; a list when the type refuses."""
    return _rebuild(elem, values, isinstance(elem, MutableSequence), _assign_items)


def default_convert(data: Any) -> Any:
    """Drop-in for ``torch.utils.data.default_convert`` (the ``batch_size=None`` path):
    numpy arrays and scalars become tensors, containers are rebuilt around converted items."""
    data_type = type(data)
    if isinstance(data, torch.Tensor):
        return data
    # torch's test: anything defined in module "numpy" but its string scalars.
    if data_type.__module__ == "numpy" and data_type.__name__ not in ("str_", "string_"):
        if data_type.__name__ == "ndarray" and _leaves.is_str_or_object(data.dtype):
            return data
        return torch.as_tensor(data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, lambda: {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return data_type(*(default_convert(d) for d in data))
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, lambda: [default_convert(d) for d in data])
    return data
