"""Large plain lists in a dataset, handed to forked workers as shared containers.

NOTE [ Automatic list sharing ]
A forked worker that reads a Python list of 2,000,000 path strings writes the reference count
of every string it touches, so the kernel copies those pages into the worker: each worker
ends up with its own copy of the list's objects (copy-on-read; measured 190 MiB per worker
for 2M paths). Before workers are forked, ``ListSharing.plan`` finds the dataset's large
lists (``type(x) is list``, at least ``MIN_ITEMS`` items, found in the instance ``__dict__``
of the dataset and of the objects it holds, a few levels deep) whose items are all ``str``,
all ``bytes``, or all plain data (numbers, ``None``, tuples of these and of strings, e.g.
``ImageFolder.samples``). Each is copied once into a ``SharedStrList``/``SharedBytesList``/
``SharedList``, and in each worker, before ``worker_init_fn``, the attribute is pointed at
the shared container. Reading an item then builds a fresh object in the worker and writes
nothing shared. The main process keeps its plain list: nothing changes there.

What the worker sees: an equal, read-only sequence (indexing, slicing, ``len``, iteration,
``in``, ``index``, ``count``, ``==`` with a list). Assigning into it raises an error that
names this note. A dataset that needs the plain list in its workers (``isinstance(x, list)``,
mutation) sets ``stoker_share_lists = False``.

Kept across epochs: the container is rebuilt only when the list changes. Change is detected
exactly with a shallow copy taken at build time: ``snapshot == current`` compares item
pointers first, so an unchanged 2M list is checked in milliseconds, and any replaced,
added or removed item triggers a rebuild. Only under ``fork``: with ``spawn``/``forkserver``
the dataset is pickled into each worker anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stoker._core.walk import iter_attributes
from stoker.formats.shared_list import SharedBytesList, SharedList, SharedStrList

MIN_ITEMS = 65_536
_PLAIN_SCALARS = (int, float, bool, type(None), str, bytes)


def _is_plain(x: Any) -> bool:
    if type(x) in _PLAIN_SCALARS:
        return True
    return type(x) is tuple and all(type(y) in _PLAIN_SCALARS for y in x)


def container_class(items: list[Any]) -> type[Any] | None:
    """The shared container that reproduces ``items`` exactly, or None if none does."""
    if all(type(x) is str for x in items):
        return SharedStrList
    if all(type(x) is bytes for x in items):
        return SharedBytesList
    if all(_is_plain(x) for x in items):
        return SharedList
    return None


def _owners(dataset: Any) -> Iterator[Any]:
    yield dataset
    for _path, value in iter_attributes(dataset):
        if isinstance(getattr(value, "__dict__", None), dict):
            yield value


@dataclass
class _Entry:
    source: list[Any]
    snapshot: list[Any]
    container: Any  # None: not shareable (mixed or rich items); remembered so as not to rescan


class ListSharing:
    """Per loader: the shared containers of its dataset's large lists, kept across epochs."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}  # id(list) -> entry (entry.source keeps it alive)

    def plan(self, dataset: Any) -> tuple[tuple[Any, str, Any], ...]:
        """``(owner, attribute name, shared container)`` for each large list to share."""
        if getattr(dataset, "stoker_share_lists", True) is False:
            self._entries = {}
            return ()
        plan = []
        kept: dict[int, _Entry] = {}
        seen: set[int] = set()
        for owner in _owners(dataset):
            if id(owner) in seen:
                continue
            seen.add(id(owner))
            for name, value in list(vars(owner).items()):
                if type(value) is not list or len(value) < MIN_ITEMS:
                    continue
                entry = kept.get(id(value)) or self._entries.get(id(value))
                if entry is None or entry.source is not value or entry.snapshot != value:
                    cls = container_class(value)
                    entry = _Entry(value, value.copy(), cls(value) if cls is not None else None)
                kept[id(value)] = entry
                if entry.container is not None:
                    plan.append((owner, name, entry.container))
        self._entries = kept
        return tuple(plan)


def apply_in_worker(plan: tuple[tuple[Any, str, Any], ...]) -> None:
    """Point each planned attribute at its shared container (in a forked worker only)."""
    for owner, name, container in plan:
        vars(owner)[name] = container
