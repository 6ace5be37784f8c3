"""``ByteSource``: the one interface record formats read through, and its local implementation.

A source is addressed by the paths (or URLs) the user gave. Every method is safe to call from
several threads at once, and a source pickles (workers receive it with the dataset): process-local
handles are opened lazily, never pickled.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable


@runtime_checkable
class ByteSource(Protocol):
    """Bytes of named objects: whole, by range, or as a local file when one exists.

    Readers also use these when a source has them (``RemoteSource`` does): ``learn_sizes`` and
    ``expect_sizes`` (sizes from one listing, or from a manifest), ``fetch_local`` (a local
    copy made on demand), ``prefetch`` and ``plan`` (objects to fetch ahead)."""

    def size(self, path: str) -> int:
        """Length of the object in bytes."""
        ...

    def read(self, path: str) -> bytes:
        """The whole object."""
        ...

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset``; exactly that many, or an error naming the object."""
        ...

    def local_path(self, path: str) -> str | None:
        """A local file holding the whole object (the file itself, or a complete cached copy),
        or ``None`` when only ``read``/``read_range`` can reach it."""
        ...


class LocalSource:
    """Files on a local (or mounted) filesystem."""

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        # os.pread: no shared file position, so threads never read each other's bytes.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        if len(data) != length:
            raise OSError(
                f"{path}: asked for {length} bytes at offset {offset}, the file has "
                f"{len(data)} there (it is {os.path.getsize(path)} bytes long); the file "
                "changed or was truncated after its index was built: rebuild the index"
            )
        return data

    def local_path(self, path: str) -> str | None:
        return path

    def __repr__(self) -> str:
        return "LocalSource()"
