"""Large plain lists in a dataset, handed to forked workers without a copy per worker.

NOTE [ Automatic list sharing ]
A forked worker that reads a Python list of 2,000,000 path strings writes the reference count
of every string it touches, so the kernel copies those pages into the worker: each worker
ends up with its own copy of the list's objects (copy-on-read; measured 190 MiB per worker
for 2M paths). Before workers are forked, ``ListSharing.plan`` finds the dataset's large
lists (``type(x) is list``, at least ``MIN_ITEMS`` items, found in the instance ``__dict__``
of the dataset and of the objects it holds, a few levels deep) whose items are plain data:
``str``, ``bytes``, numbers, ``None``, tuples of these (e.g. ``ImageFolder.samples``). In
each worker, before ``worker_init_fn``, the attribute is pointed at a stand-in that builds a
fresh object per read and writes nothing shared. Two stand-ins, best first:

* ``READ_IN_PLACE``: the worker wraps the list it inherited in an ``InheritedList``, which
  reads the items' bytes where they are (NOTE [ Reading inherited lists in place ]). Nothing
  is copied or built in the main process, and the worker sees exactly the list at fork time.
  Used when nothing but the dataset's attributes refers to the list (its reference count
  says so): otherwise code in the worker could change it through another reference while
  the view reads it.
* A shared container (``SharedStrList``/``SharedBytesList``/``SharedList``): the list is
  copied once into shared memory. Used when the list is also held elsewhere, or where this
  interpreter's object layout is not one ``InheritedList`` reads. Kept across epochs and
  rebuilt only when the list changes, detected exactly with a shallow copy taken at build
  time: every item must be the very object it was (``is``, not ``==``: an item changed from
  ``1`` to ``1.0`` equals it, and workers would go on seeing ints). The snapshot holds the old
  items, so none can be freed and another take its address; an unchanged 2M list is checked
  in milliseconds, and any replaced, added or removed item triggers a rebuild.

The main process keeps its plain list: nothing changes there. What the worker sees is a
``ListStandIn`` over either: the list in every way a program can observe but its type
(``==``, ``repr``, ``copy()``, ``+``, ``*``, comparisons, and changes, which go to the worker's
own copy from then on, as under torch). Because a program can tell (``isinstance(x, list)``
in the worker), sharing is beyond torch: only with ``beyond_torch`` naming ``shared_lists``
(NOTE [ Same as torch unless asked ]) or a dataset class declaring ``stoker_share_lists =
True``; ``stoker_share_lists = False`` refuses it even then. Only under ``fork``: with
``spawn``/``forkserver`` the dataset is pickled into each worker anyway.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stoker._core.dataset_hooks import SupportsShareLists, flag
from stoker._core.walk import iter_attributes

# Every loader has a ``ListSharing``, few share a list: the containers and stand-ins load
# when a plan first does (NOTE [ Import only what the loader needs ]).

MIN_ITEMS = 65_536
_PLAIN_SCALARS = (int, float, bool, type(None), str, bytes)


def _is_plain(x: Any) -> bool:
    if type(x) in _PLAIN_SCALARS:
        return True
    return type(x) is tuple and all(type(y) in _PLAIN_SCALARS for y in x)


def container_class(items: list[Any]) -> type[Any] | None:
    """The shared container that reproduces ``items`` exactly, or None if none does."""
    from stoker.sharing.shared_list import SharedBytesList, SharedList, SharedStrList

    if all(type(x) is str for x in items):
        return SharedStrList
    if all(type(x) is bytes for x in items):
        return SharedBytesList
    if all(_is_plain(x) for x in items):
        return SharedList
    return None


def _owners(dataset: Any) -> Iterator[Any]:
    """The dataset and the objects it holds that keep attributes in a ``__dict__`` (a plain
    list, tuple or array used as the dataset has none)."""
    if isinstance(getattr(dataset, "__dict__", None), dict):
        yield dataset
    for _path, value in iter_attributes(dataset):
        if isinstance(getattr(value, "__dict__", None), dict):
            yield value


@dataclass
class _Entry:
    source: list[Any]
    snapshot: list[Any]
    container: Any  # None: not shareable (mixed or rich items); remembered so as not to rescan


class _ReadInPlace:
    """Plan marker: the worker wraps the list it inherited in an ``InheritedList``."""

    def __repr__(self) -> str:
        return "READ_IN_PLACE"


READ_IN_PLACE = _ReadInPlace()
_SAMPLE = 64  # items looked at to decide whether reading in place pays


def _references(holder: dict[int, list[Any]], key: int) -> int:
    return sys.getrefcount(holder[key])


def _held_only_by(holder: dict[int, list[Any]], key: int, known: int) -> bool:
    """Whether ``holder[key]`` has no references but ``holder``'s and ``known`` others."""
    # A list with exactly one reference: what this interpreter's count reports for that.
    probe: dict[int, list[Any]] = {0: []}
    return _references(holder, key) - _references(probe, 0) == known


def _pays_to_read_in_place(items: list[Any]) -> bool:
    """Plain items (sampled), read back equal by this interpreter (NOTE [ Reading inherited
    lists in place ])."""
    from stoker.sharing import inherited_list

    n = len(items)
    positions = sorted({*range(0, n, max(1, n // _SAMPLE)), n - 1})
    return all(_is_plain(items[i]) for i in positions) and inherited_list.reads_back(
        items, positions
    )


def _large_lists(
    dataset: Any,
) -> tuple[dict[int, list[Any]], dict[int, list[tuple[Any, str]]]]:
    """The dataset's large lists by id, and the ``(owner, attribute name)`` slots of each."""
    found: dict[int, list[Any]] = {}
    slots: dict[int, list[tuple[Any, str]]] = {}
    seen: set[int] = set()
    for owner in _owners(dataset):
        if id(owner) in seen:
            continue
        seen.add(id(owner))
        for name, value in vars(owner).items():
            if type(value) is list and len(value) >= MIN_ITEMS:
                found[id(value)] = value
                slots.setdefault(id(value), []).append((owner, name))
    return found, slots


class ListSharing:
    """Per loader: how each large list of its dataset goes to forked workers, kept across
    epochs (a shared container is rebuilt only when its list changes)."""

    def __init__(self, enabled: bool = True) -> None:
        """``enabled=False``: lists reach workers as under torch (NOTE [ One switch for the
        fast paths ] in stoker.fastpaths.switch)."""
        self._entries: dict[int, _Entry] = {}  # id(list) -> entry (entry.source keeps it alive)
        self._enabled = enabled

    def plan(self, dataset: Any, asked: bool = True) -> tuple[tuple[Any, str, Any], ...]:
        """``(owner, attribute name, READ_IN_PLACE or a shared container)`` per large list.
        ``asked``: the loader's ``beyond_torch`` names ``shared_lists`` (NOTE [ Same as torch
        unless asked ]: inside workers a stand-in is not ``type list``); a dataset class can
        also ask with ``stoker_share_lists = True``, or refuse with ``False``."""
        declared = flag(dataset, SupportsShareLists)
        if not self._enabled or declared is False or not (asked or declared is True):
            self._entries = {}
            return ()
        from stoker.sharing import inherited_list

        found, slots = _large_lists(dataset)
        plan: list[tuple[Any, str, Any]] = []
        kept: dict[int, _Entry] = {}
        for key, owned in slots.items():
            # The list's references: its attributes, ``found``, and an entry of ours.
            old = self._entries.get(key)
            known = len(owned) + (old is not None and old.source is found[key])
            if (
                inherited_list.available()
                and _held_only_by(found, key, known)
                and _pays_to_read_in_place(found[key])
            ):
                plan += [(owner, name, READ_IN_PLACE) for owner, name in owned]
                continue
            value = found[key]
            if old is None or old.source is not value or not _unchanged(old.snapshot, value):
                cls = container_class(value)
                old = _Entry(value, value.copy(), cls(value) if cls is not None else None)
            kept[key] = old
            if old.container is not None:
                plan += [(owner, name, old.container) for owner, name in owned]
        self._entries = kept
        return tuple(plan)


def _unchanged(snapshot: list[Any], current: list[Any]) -> bool:
    """Every item is the object it was (identity: ``1 == 1.0``, yet workers must see 1.0)."""
    return len(snapshot) == len(current) and all(map(operator.is_, snapshot, current))


def apply_in_worker(plan: tuple[tuple[Any, str, Any], ...]) -> None:
    """Point each planned attribute at its stand-in (in a forked worker only)."""
    from stoker.sharing.inherited_list import InheritedList
    from stoker.sharing.stand_in import ListStandIn

    views: dict[int, ListStandIn] = {}
    for owner, name, shared in plan:
        source = vars(owner)[name]
        if id(source) not in views:  # one stand-in per list, however many attributes hold it
            views[id(source)] = ListStandIn(
                InheritedList(source) if shared is READ_IN_PLACE else shared
            )
        vars(owner)[name] = views[id(source)]
        del source  # the view holds the list's only reference from now on
