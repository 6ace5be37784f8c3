"""Read-only lists kept in one shared-memory buffer, so that workers never copy them.

A Python list of 2,000,000 path strings is 2,000,000 objects. A forked worker that reads them
writes each object's reference count, so the kernel copies every page it touches into that
worker: memory grows by the list's size per worker (copy-on-read). These containers hold all
elements in one flat buffer with an offsets array instead, and build a fresh object on each
access, so reading writes nothing shared:

    self.paths = stoker.formats.SharedStrList(self.paths)      # list of str
    self.blobs = stoker.formats.SharedBytesList(self.blobs)    # list of bytes
    self.items = stoker.formats.SharedList(self.items)         # any picklable objects

Layout of one container: a shared-memory segment holding ``offsets`` (int64, ``n + 1``
entries, ``offsets[0] == 0``) followed by the element bytes; element ``i`` is
``data[offsets[i]:offsets[i + 1]]`` (UTF-8 for str, raw for bytes, a pickle for objects).
``buffer`` and ``offsets`` expose both as read-only numpy arrays.

NOTE [ Sharing across start methods ]
The segment comes from ``stoker.transport.segments`` (a ``memfd`` on Linux: not limited by the
size of ``/dev/shm``, freed by the kernel with its last fd and mapping). The container owns a
private duplicate of its fd (not registered with ``segments``, so a forked worker's
``close_inherited`` leaves it open) and maps the segment without an fd of its own.

* ``fork``: the child inherits the mapping; reading touches no shared page, so nothing is copied.
* ``spawn`` / ``forkserver`` and ``multiprocessing`` queues: each class is registered with
  ``multiprocessing.reduction.ForkingPickler``, the pickler they use. It sends the fd
  (``DupFd``: passed to a child being started, or through the resource sharer), never the
  bytes, and the receiver maps the same segment. This is the mechanism torch's own tensor
  reducers use; a torch tensor is not used here because torch's shared memory lives in
  ``/dev/shm``, which Docker limits to 64 MiB by default.
* Plain ``pickle`` (``torch.save``, ``copy.deepcopy``, a file): the bytes are copied, and the
  unpickled container gets a new segment of its own.
"""

from __future__ import annotations

import os
import pickle
import weakref
from collections.abc import Iterable, Sequence
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, TypeVar

import numpy as np

from stoker.sharing.read_only import ReadOnlySequence
from stoker.transport import segments

T = TypeVar("T")
_OFFSET_BYTES = 8


class _Segment:
    """One mapped segment: the container's own fd and a mapping of the first ``used`` bytes."""

    __slots__ = ("fd", "used", "mapping", "__weakref__")

    def __init__(self, fd: int, used: int) -> None:
        self.fd = fd
        self.used = used
        self.mapping = segments.map_lease(fd, used)
        weakref.finalize(self, _close_fd, fd)

    def raw(self) -> np.ndarray:
        """The whole mapping as a uint8 array (page-rounded: longer than ``used``)."""
        return np.frombuffer(memoryview(self.mapping).cast("B"), dtype=np.uint8)

    @classmethod
    def create(cls, used: int) -> _Segment:
        fd = segments.create_untracked(used)  # survives a forked worker's close_inherited()
        try:
            return cls(fd, used)
        except BaseException:
            os.close(fd)
            raise


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class _SharedSequence(ReadOnlySequence[T]):
    """The storage and access shared by the three containers; subclasses pick the codec."""

    __slots__ = ("_segment", "_offs", "_data", "__weakref__")

    def __init__(self, items: Iterable[T] = ()) -> None:
        seq = items if isinstance(items, (list, tuple)) else list(items)
        lengths, blob = self._encode_all(seq)
        n = len(seq)
        head = _OFFSET_BYTES * (n + 1)
        segment = _Segment.create(head + len(blob))
        raw = segment.raw()
        offsets = raw[:head].view(np.int64)
        offsets[0] = 0
        np.cumsum(lengths, out=offsets[1:])
        raw[head : head + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        self._attach(segment, n)

    # -- codec (per subclass) -------------------------------------------------------------------

    @classmethod
    def _encode_all(cls, items: Sequence[Any]) -> tuple[np.ndarray, bytes]:
        """Element byte lengths (int64) and all elements' bytes joined."""
        raise NotImplementedError

    # -- storage ----------------------------------------------------------------------------------

    def _attach(self, segment: _Segment, n: int) -> None:
        head = _OFFSET_BYTES * (n + 1)
        raw = memoryview(segment.mapping).cast("B")[: segment.used]
        self._segment = segment
        self._len = n
        self._offs = raw[:head].toreadonly().cast("q")
        self._data = raw[head:].toreadonly()

    @classmethod
    def _from_segment(cls, segment: _Segment, n: int) -> Any:
        obj = cls.__new__(cls)
        obj._attach(segment, n)
        return obj

    @property
    def offsets(self) -> np.ndarray:
        """The ``len(self) + 1`` element boundaries in ``buffer`` (read-only int64 view)."""
        return np.frombuffer(self._offs, dtype=np.int64)

    @property
    def buffer(self) -> np.ndarray:
        """All elements' bytes, back to back (read-only uint8 view of the shared segment)."""
        return np.frombuffer(self._data, dtype=np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory this container uses (offsets + element bytes)."""
        return self._segment.used

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._len:,} items, {self._segment.used / 2**20:.1f} MiB "
            "shared)"
        )

    # -- pickling (NOTE [ Sharing across start methods ]) -----------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        """Plain pickle: copy the bytes (a file or ``torch.save`` cannot carry an fd)."""
        seg = self._segment
        return (_rebuild_copy, (type(self), self._len, _used_bytes(seg)))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ForkingPickler.register(cls, _reduce_shared)


def _reduce_shared(obj: _SharedSequence[Any]) -> tuple[Any, ...]:
    """ForkingPickler: send the segment's fd, not its bytes."""
    seg = obj._segment
    return (_rebuild_shared, (type(obj), DupFd(seg.fd), seg.used, obj._len))


def _rebuild_shared(cls: type[Any], dup_fd: Any, used: int, n: int) -> Any:
    fd = dup_fd.detach()
    try:
        segment = _Segment(fd, used)
    except BaseException:
        os.close(fd)
        raise
    return cls._from_segment(segment, n)


def _used_bytes(seg: _Segment) -> bytes:
    return seg.raw()[: seg.used].tobytes()


def _rebuild_copy(cls: type[Any], n: int, blob: bytes) -> Any:
    segment = _Segment.create(len(blob))
    segment.raw()[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    return cls._from_segment(segment, n)


def _lengths(items: Sequence[Any]) -> np.ndarray:
    return np.fromiter(map(len, items), dtype=np.int64, count=len(items))


def _type_error(cls_name: str, items: Sequence[Any], ok: tuple[type, ...], hint: str) -> TypeError:
    bad = next((i for i, x in enumerate(items) if not isinstance(x, ok)), None)
    where = f"item {bad} is {type(items[bad]).__name__}" if bad is not None else "an item is not"
    return TypeError(
        f"{cls_name} holds {hint} only; {where}. Use stoker.formats.SharedList "
        "for arbitrary picklable objects."
    )


class SharedStrList(_SharedSequence[str]):
    """A read-only list of ``str`` in one shared buffer (UTF-8); ``[i]`` returns a new str.

    Lone surrogates (``os.fsdecode`` of undecodable file names) round-trip exactly.
    """

    __slots__ = ()

    @classmethod
    def _encode_all(cls, items: Sequence[Any]) -> tuple[np.ndarray, bytes]:
        try:
            joined = "".join(items)
        except TypeError:
            raise _type_error(cls.__name__, items, (str,), "str") from None
        if joined.isascii():  # one byte per character: lengths without encoding each item
            return _lengths(items), joined.encode("ascii")
        del joined
        encoded = [s.encode("utf-8", "surrogatepass") for s in items]
        return _lengths(encoded), b"".join(encoded)

    def _get(self, i: int) -> str:
        offs = self._offs
        return str(self._data[offs[i] : offs[i + 1]], "utf-8", "surrogatepass")


class SharedBytesList(_SharedSequence[bytes]):
    """A read-only list of ``bytes`` in one shared buffer; ``[i]`` returns new bytes."""

    __slots__ = ()

    @classmethod
    def _encode_all(cls, items: Sequence[Any]) -> tuple[np.ndarray, bytes]:
        try:
            blob = b"".join(items)
            lengths = _lengths(items)
        except TypeError:
            lengths = None
        if lengths is None or int(lengths.sum()) != len(blob):  # e.g. a str, or an int array
            raise _type_error(cls.__name__, items, (bytes, bytearray), "bytes or bytearray")
        return lengths, blob

    def _get(self, i: int) -> bytes:
        offs = self._offs
        return bytes(self._data[offs[i] : offs[i + 1]])


class SharedList(_SharedSequence[Any]):
    """A read-only list of picklable objects, each pickled into one shared buffer.

    ``[i]`` unpickles a new object: mutating it does not change the container.
    """

    __slots__ = ()

    @classmethod
    def _encode_all(cls, items: Sequence[Any]) -> tuple[np.ndarray, bytes]:
        protocol = pickle.HIGHEST_PROTOCOL
        pickled = [pickle.dumps(x, protocol=protocol) for x in items]
        return _lengths(pickled), b"".join(pickled)

    def _get(self, i: int) -> Any:
        offs = self._offs
        return pickle.loads(self._data[offs[i] : offs[i + 1]])
