"""What a forked worker sees in place of a dataset's large plain list (NOTE [ Automatic list
sharing ]): the list in every way a program can observe but its type.

It reads items from a read-only source (an ``InheritedList`` reading the parent's list in
place, or a shared container), and answers like the list: ``==``, ``<``, ``repr``/``str``,
``copy()``, ``+``, ``*``, ``in``, ``index``, ``count``, slicing to a list, pickling as a list.
The first change (``append``, item assignment, ``sort``, ``+=``, ...) copies the items into a
private list that serves from then on, as a worker's own copy of the list changes under torch;
nothing else sees the change (under fork nothing else does under torch either).
``type(x) is list`` and C code that requires an exact list (``json.dumps``) tell it apart: a
dataset that needs that sets ``stoker_share_lists = False``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, SupportsIndex

from stoker.sharing.read_only import ReadOnlySequence


def _as_list(x: Any) -> list[Any] | None:
    if type(x) is list:
        return x
    if isinstance(x, ListStandIn):
        return list(x)
    return None


class ListStandIn(ReadOnlySequence[Any]):
    __slots__ = ("_items", "_own", "__weakref__")

    def __init__(self, items: ReadOnlySequence[Any]) -> None:
        self._items: ReadOnlySequence[Any] | None = items
        self._own: list[Any] | None = None
        self._len = len(items)

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        own = self._own
        return self._len if own is None else len(own)

    def __getitem__(self, index: Any) -> Any:
        own = self._own
        if own is not None:
            return own[index]
        return self._items[index]  # type: ignore[index]

    def _get(self, i: int) -> Any:
        own = self._own
        return self._items._get(i) if own is None else own[i]  # type: ignore[union-attr]

    def __iter__(self) -> Iterator[Any]:
        own = self._own
        return iter(self._items if own is None else own)  # type: ignore[arg-type]

    def __contains__(self, value: object) -> bool:
        own = self._own
        return value in (self._items if own is None else own)  # type: ignore[operator]

    def copy(self) -> list[Any]:
        return list(self)

    def __repr__(self) -> str:
        return repr(list(self))

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __add__(self, other: Any) -> list[Any]:
        theirs = _as_list(other)
        if theirs is None:
            raise TypeError(f'can only concatenate list (not "{type(other).__name__}") to list')
        return list(self) + theirs

    def __radd__(self, other: Any) -> list[Any]:
        theirs = _as_list(other)
        if theirs is None:
            return NotImplemented
        return theirs + list(self)

    def __mul__(self, n: SupportsIndex) -> list[Any]:
        return list(self) * n

    __rmul__ = __mul__

    def _compare(self, other: Any) -> list[Any] | None:
        return _as_list(other)

    def __lt__(self, other: Any) -> bool:
        theirs = self._compare(other)
        return NotImplemented if theirs is None else list(self) < theirs

    def __le__(self, other: Any) -> bool:
        theirs = self._compare(other)
        return NotImplemented if theirs is None else list(self) <= theirs

    def __gt__(self, other: Any) -> bool:
        theirs = self._compare(other)
        return NotImplemented if theirs is None else list(self) > theirs

    def __ge__(self, other: Any) -> bool:
        theirs = self._compare(other)
        return NotImplemented if theirs is None else list(self) >= theirs

    # -- changing: the worker's own copy from the first change on -------------------------------

    def _mine(self) -> list[Any]:
        if self._own is None:
            self._own = list(self._items)  # type: ignore[arg-type]
            self._items = None  # the source (and its shared memory) is not needed any more
        return self._own

    def __setitem__(self, index: Any, value: Any) -> None:
        self._mine()[index] = value

    def __delitem__(self, index: Any) -> None:  # type: ignore[override]
        del self._mine()[index]

    def __iadd__(self, other: Iterable[Any]) -> ListStandIn:  # type: ignore[misc]
        self._mine().extend(other)
        return self

    def __imul__(self, n: SupportsIndex) -> ListStandIn:
        own = self._mine()
        own *= n
        return self

    def append(self, value: Any) -> None:
        self._mine().append(value)

    def extend(self, values: Iterable[Any]) -> None:
        self._mine().extend(values)

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._mine().insert(index, value)

    def pop(self, index: SupportsIndex = -1) -> Any:
        return self._mine().pop(index)

    def remove(self, value: Any) -> None:
        self._mine().remove(value)

    def clear(self) -> None:
        self._mine().clear()

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        self._mine().sort(key=key, reverse=reverse)

    def reverse(self) -> None:
        self._mine().reverse()
