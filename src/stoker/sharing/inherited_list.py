"""A forked worker's read-only view of a list it inherited, read without touching its items.

NOTE [ Reading inherited lists in place ]
A forked worker starts with its parent's memory, shared page by page until one side writes.
Reading ``paths[i]`` from a plain list writes the reference count of the item, so the page
holding it is copied into the worker: over an epoch, every worker copies the whole list's
objects (copy-on-read). ``InheritedList`` reads the same objects' bytes instead, through their
addresses, and builds a fresh equal object in the worker: it writes no inherited page, so the
worker costs no memory for the list, and the worker sees exactly the list its parent had when
it forked (no copy, nothing to keep in sync).

Which items are read in place: exact ``str`` (compact: every str Python creates itself),
``bytes``, ``int``, ``float``, ``bool``, ``None`` and tuples of these. Any other item (a
``str`` subclass, a dict) is returned as the object itself, as a list would return it.

Two conditions make this safe, and both are checked before it is used:
* The object layout of this interpreter is the one read here. ``layout()`` checks it once
  per process by reading objects of every supported kind and comparing the results; any
  difference (another Python version, a free-threaded or debug build) turns the view off.
* Nothing in the worker can change the list while the view reads it: the caller hands over a
  list that nothing else refers to (``stoker.sharing.auto_share`` checks the reference count
  in the parent), and the view never gives out the list itself.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from stoker.sharing.read_only import ReadOnlySequence

# All of the process's memory as one buffer (from the first page up: address 0 is never
# mapped). Reading an unmapped address through it faults like C code would, so it is only read
# at addresses of live objects (see the NOTE).
_BASE = 4096
_MEM = (
    memoryview((ctypes.c_char * (1 << 62)).from_address(_BASE)).cast("B")
    if ctypes.sizeof(ctypes.c_void_p) == 8
    else memoryview(b"")
)
_U64 = struct.Struct("=Q").unpack_from
_I64 = struct.Struct("=q").unpack_from
_F64 = struct.Struct("=d").unpack_from
_STR_HEAD = struct.Struct("=qqI").unpack_from  # PyASCIIObject length, hash, state
_MAX_DEPTH = 4  # tuples nested deeper are returned as objects
_ITER_CHUNK = 4096

# Offsets every 64-bit CPython 3.11-3.13 (default build) shares: checked by ``layout()``.
_TYPE = 8  # PyObject.ob_type
_SIZE = 16  # PyVarObject.ob_size; PyASCIIObject.length
_STR_STATE = 32  # PyASCIIObject.state (after length and hash)
_ITEMS = 24  # PyTupleObject.ob_item[0]; the pointer PyListObject.ob_item; PyLongObject digits
_FLOAT = 16  # PyFloatObject.ob_fval
_STR_CODECS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


@dataclass(frozen=True)
class _Layout:
    ascii_data: int  # where a compact ASCII string's characters start
    compact_data: int  # where other compact strings' characters start
    bytes_data: int
    int_size: Callable[[int], tuple[int, int]]  # int object address -> (sign, digit count)
    digit_bytes: int
    digit_bits: int


def _int_size_311(at: int) -> tuple[int, int]:
    (size,) = _I64(_MEM, at + _SIZE)  # digit count, carrying the sign
    return (1 if size > 0 else -1 if size < 0 else 0), abs(size)


def _int_size_312(at: int) -> tuple[int, int]:
    (tag,) = _U64(_MEM, at + _SIZE)  # digit count << 3 | sign (0: positive, 1: zero, 2: negative)
    return 1 - (tag & 3), tag >> 3


class _Reader:
    """Decodes the object at an address into a fresh equal object (see the NOTE)."""

    def __init__(self, lay: _Layout) -> None:
        self.lay = lay
        self.str_t, self.bytes_t, self.tuple_t = id(str), id(bytes), id(tuple)
        self.int_t, self.float_t = id(int), id(float)
        self.constants = {id(None): None, id(True): True, id(False): False}
        self.digit_code = "I" if lay.digit_bytes == 4 else "H"

    def object_at(self, p: int, depth: int = 0) -> Any:
        at = p - _BASE
        (tp,) = _U64(_MEM, at + _TYPE)  # read first: every object has a type, not every a size
        if tp == self.str_t:
            n, _hash, state = _STR_HEAD(_MEM, at + _SIZE)
            if state & 0x60 == 0x60:  # compact and ASCII
                start = at + self.lay.ascii_data
                return str(_MEM[start : start + n], "ascii")
            if state & 0x20:  # compact: bytes per character in bits 2-4
                kind = (state >> 2) & 7
                start = at + self.lay.compact_data
                return str(_MEM[start : start + n * kind], _STR_CODECS[kind], "surrogatepass")
        elif tp == self.bytes_t:
            start = at + self.lay.bytes_data
            return _MEM[start : start + _I64(_MEM, at + _SIZE)[0]].tobytes()
        elif tp == self.int_t:
            return self._int_at(at)
        elif tp == self.float_t:
            return _F64(_MEM, at + _FLOAT)[0]
        elif tp == self.tuple_t and depth < _MAX_DEPTH:
            (n,) = _I64(_MEM, at + _SIZE)
            ptrs = struct.unpack_from(f"={n}Q", _MEM, at + _ITEMS) if n else ()
            return tuple(self.object_at(q, depth + 1) for q in ptrs)
        elif p in self.constants:
            return self.constants[p]
        return ctypes.cast(p, ctypes.py_object).value  # anything else: the object itself

    def _int_at(self, at: int) -> int:
        lay = self.lay
        sign, ndigits = lay.int_size(at)
        if ndigits == 0:
            return 0
        value = 0
        digits = struct.unpack_from(f"={ndigits}{self.digit_code}", _MEM, at + _ITEMS)
        for digit in reversed(digits):
            value = (value << lay.digit_bits) | digit
        return sign * value


def _probe_objects() -> list[Any]:
    """Fresh (not interned, not cached) objects of every kind the reader decodes."""
    parts = ["pa", "th/é", "Ā", "😀", "\udc80"]
    texts = ["".join([parts[0], "th"]), "".join(parts[:2]), "".join(parts[:3])]
    texts += ["".join(parts[:4]), "".join([parts[0], parts[4]]), "".join([])]
    ints = [0, 1, -1, 255, 300, -300, 2**31 + 7, -(2**65 + 3), 10**40, int("12345678901234567")]
    return [
        *texts,
        b"".join([b"by", b"tes\x00\xff"]),
        b"",
        *ints,
        0.1 + 0.2,
        -1e300,
        None,
        True,
        False,
        ("".join(["a", "b"]), 7, (1.5, None)),
        (),
    ]


@cache
def layout() -> _Layout | None:
    """This interpreter's object layout, if it is the one the reader knows; else None."""
    import sysconfig  # here: torch's loader does not import it (a dataset sees sys.modules)

    if (
        sys.implementation.name != "cpython"
        or sysconfig.get_config_var("Py_GIL_DISABLED")
        or ctypes.sizeof(ctypes.c_void_p) != 8
        or sys.getsizeof(object()) != 16  # a debug build (Py_TRACE_REFS) has a larger header
        or sys.int_info.sizeof_digit not in (2, 4)
    ):
        return None
    base = {
        "ascii_data": sys.getsizeof("") - 1,
        "compact_data": sys.getsizeof("é") - 2,
        "bytes_data": sys.getsizeof(b"") - 1,
        "digit_bytes": sys.int_info.sizeof_digit,
        "digit_bits": sys.int_info.bits_per_digit,
    }
    probe = _probe_objects()
    for int_size in (
        (_int_size_312, _int_size_311) if sys.version_info >= (3, 12) else (_int_size_311,)
    ):
        candidate = _Layout(int_size=int_size, **base)
        if _reads_back(_Reader(candidate), probe):
            return candidate
    return None


def _reads_back(reader: _Reader, objects: list[Any]) -> bool:
    try:
        got = [reader.object_at(id(x)) for x in objects]
    except Exception:
        return False
    return all(type(a) is type(b) and a == b for a, b in zip(got, objects, strict=True)) and (
        _list_items(objects) == [id(x) for x in objects]
    )


def _list_items(items: list[Any]) -> list[int]:
    """The item addresses of a list, read from its own array (PyListObject.ob_item)."""
    n = len(items)
    if n == 0:
        return []
    (array,) = _U64(_MEM, id(items) - _BASE + _ITEMS)
    return list(struct.unpack_from(f"={n}Q", _MEM, array - _BASE))


@cache
def _reader() -> _Reader | None:
    lay = layout()
    return _Reader(lay) if lay is not None else None


def available() -> bool:
    """Whether this interpreter's lists can be read in place (see ``layout``)."""
    return _reader() is not None


def reads_back(items: list[Any], positions: range | list[int]) -> bool:
    """Whether the items at ``positions`` read in place equal the items themselves."""
    reader = _reader()
    return reader is not None and _reads_back(reader, [items[i] for i in positions])


class InheritedList(ReadOnlySequence[Any]):
    """A read-only view of ``source`` that reads its items without writing them.

    ``source`` must not change while the view exists, and nothing else may change it: the
    view keeps the only reference it needs and never gives the list out.
    """

    __slots__ = ("_source", "_array_at", "_object_at", "__weakref__")

    def __init__(self, source: list[Any]) -> None:
        reader = _reader()
        if type(source) is not list or reader is None:
            raise TypeError("InheritedList reads a plain list on a CPython it knows (layout())")
        self._source = source
        self._len = n = len(source)
        self._object_at = reader.object_at
        # Where the list's own array of item pointers is: reading it writes nothing.
        self._array_at = _U64(_MEM, id(source) - _BASE + _ITEMS)[0] - _BASE if n else 0

    def _get(self, i: int) -> Any:
        return self._object_at(_U64(_MEM, self._array_at + 8 * i)[0])

    def __iter__(self) -> Iterator[Any]:
        object_at = self._object_at
        for start in range(0, self._len, _ITER_CHUNK):
            count = min(_ITER_CHUNK, self._len - start)
            for p in struct.unpack_from(f"={count}Q", _MEM, self._array_at + 8 * start):
                yield object_at(p)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the plain list it shows."""
        return (list, (list(self),))

    def __repr__(self) -> str:
        return f"InheritedList({self._len:,} items, read in place)"
