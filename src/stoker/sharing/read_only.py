"""The list-like, read-only sequence API shared by stoker's list stand-ins."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class ReadOnlySequence(Sequence[T], Generic[T]):
    """Indexing, slicing (to a list), iteration and list equality over ``_len`` and ``_get``.

    Subclasses set ``_len`` and implement ``_get(i)`` for ``0 <= i < _len``.
    """

    __slots__ = ("_len",)

    _len: int

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        n = self._len
        if type(index) is not int:
            if isinstance(index, slice):
                return [self._get(i) for i in range(*index.indices(n))]
            index = operator.index(index)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"{type(self).__name__} index {index} out of range (len {n})")
        return self._get(i)

    def _get(self, i: int) -> T:
        """Element ``i`` (``0 <= i < len``)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[T]:
        get = self._get
        for i in range(self._len):
            yield get(i)

    def __eq__(self, other: object) -> bool:
        """Equal to a list, or another such sequence, with equal items (like a list)."""
        if not isinstance(other, (list, ReadOnlySequence)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # unhashable, like a list

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            f"{type(self).__name__} is read-only. If stoker gave it to this worker in place of "
            "a plain list (NOTE [ Automatic list sharing ] in stoker.sharing.auto_share), set "
            "stoker_share_lists = False on the dataset to keep the list, or change it in the "
            "main process before iterating."
        )

    __delitem__ = __setitem__
