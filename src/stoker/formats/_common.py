"""What every reader shares: its optional library (with the install hint), its byte source, and
the paths it names files by (local paths or URLs, resolved the same way)."""

from __future__ import annotations

import importlib
import io
import os
import posixpath
from types import ModuleType

from stoker.storage import ByteSource, LocalSource


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
    from stoker import storage

    open_source = getattr(storage, "open_source", None)
    if open_source is None:
        raise ValueError(
            f"{path}: reading URLs needs stoker.storage.open_source, which this stoker does "
            "not have; pass source= (a stoker.storage.ByteSource) or a local path"
        )
    return open_source(path)  # type: ignore[no-any-return]


def join(base_dir: str, name: str) -> str:
    """``name`` relative to ``base_dir`` (a directory path or URL); absolute names as given."""
    if is_url(name) or posixpath.isabs(name) or not base_dir:
        return name
    return posixpath.join(base_dir, name)


def parent(path: str) -> str:
    return posixpath.dirname(path.rstrip("/"))


class SourceFile(io.RawIOBase):
    """A read-only, seekable file over ``source.read_range``, for parsers that want a file
    (tarfile, pyarrow). Wrap it in ``io.BufferedReader`` to batch small reads."""

    def __init__(self, source: ByteSource, path: str) -> None:
        self.source, self.path = source, path
        self.length = source.size(path)
        self.position = 0

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

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.length - self.position)
        if want <= 0:
            return 0
        data = self.source.read_range(self.path, self.position, want)
        buffer[:want] = data
        self.position += want
        return want


def write_atomic(path: str, data: bytes) -> None:
    """Write a local file so that it exists whole or not at all (a crash leaves a ``.partial``)."""
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
