"""What every reader shares: its optional library (with the install hint), its byte source, and
the paths it names files by (local paths or URLs, resolved the same way)."""

from __future__ import annotations

import importlib
import io
import os
import posixpath
from types import ModuleType
from typing import Any

from stoker.storage import ByteSource, LocalSource, open_source


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import an optional library, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs the {module!r} package, which is not installed. Install it with: "
            f"pip install 'stoker[{extra}]'"
        ) from exc


def is_url(path: str) -> bool:
    return "://" in path


def default_source(path: str, source: ByteSource | None) -> ByteSource:
    """The source a reader reads ``path`` through: the one given, a local one for a path, or
    the object-store source ``stoker.storage.open_source`` opens for a URL."""
    if source is not None:
        return source
    if not is_url(path):
        return LocalSource()
    return open_source(path)


def join(base_dir: str, name: str) -> str:
    """``name`` relative to ``base_dir`` (a directory path or URL); absolute names as given."""
    if is_url(name) or posixpath.isabs(name) or not base_dir:
        return name
    return posixpath.join(base_dir, name)


def parent(path: str) -> str:
    return posixpath.dirname(path.rstrip("/"))


class _SeekableReader(io.RawIOBase):
    """A read-only, seekable raw file of ``length`` bytes; subclasses say how to read a range."""

    def __init__(self, length: int) -> None:
        self.length, self.position = length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.length - self.position)
        if want <= 0:
            return 0
        buffer[:want] = self._read_at(self.position, want)
        self.position += want
        return want

    def _read_at(self, offset: int, size: int) -> Any:
        raise NotImplementedError


class SourceFile(_SeekableReader):
    """A file over ``source.read_range``, for parsers that want a file (tarfile, pyarrow).
    Wrap it in ``io.BufferedReader`` to batch small reads."""

    def __init__(self, source: ByteSource, path: str) -> None:
        super().__init__(source.size(path))
        self.source, self.path = source, path

    def _read_at(self, offset: int, size: int) -> bytes:
        return self.source.read_range(self.path, offset, size)


class ViewFile(_SeekableReader):
    """A file over a memoryview, without copying it (``io.BytesIO`` would copy)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self.view = view

    def _read_at(self, offset: int, size: int) -> memoryview:
        return self.view[offset : offset + size]


def write_atomic(path: str, data: bytes) -> None:
    """Write a local file so that it exists whole or not at all (a crash leaves a ``.partial``)."""
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
