"""What every reader shares: its optional library (with the install hint), its byte source, and
the paths it names files by (local paths or URLs, resolved the same way)."""

from __future__ import annotations

import importlib
import io
import itertools
import os
import posixpath
import re
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


_INT_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
_OTHER_RANGE = re.compile(r"-?\d+\.\.-?\d+\.\.-?\d+|[A-Za-z]\.\.[A-Za-z](\.\.-?\d+)?")


def expand_braces(pattern: str) -> list[str]:
    """The paths a shard pattern names, as WebDataset expands it (the ``braceexpand`` package's
    rules, for the part shard names use): ``s-{000..002}.tar`` -> ``s-000.tar`` ..
    ``s-002.tar`` (zero-padded when a bound is), ``{a,b}`` alternatives, nested, several in a
    row; any other ``{...}`` is kept as it is (no backslash escapes)."""
    parts: list[list[str]] = []  # the paths are every combination of one string per part
    start = depth = 0
    for pos, char in enumerate(pattern):
        if char == "{":
            if depth == 0:
                parts.append([pattern[start:pos]])
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                break
            if depth == 0:
                parts.append(_alternatives(pattern[start + 1 : pos], pattern))
                start = pos + 1
    if depth != 0:
        raise ValueError(f"{pattern!r}: unbalanced braces in the shard pattern; give a list of "
                         "paths or a pattern such as 'shards/s-{000000..000099}.tar'")
    parts.append([pattern[start:]])
    return ["".join(combination) for combination in itertools.product(*parts)]


def _alternatives(body: str, pattern: str) -> list[str]:
    """The strings one ``{body}`` of ``pattern`` stands for."""
    bounds = _INT_RANGE.fullmatch(body)
    if bounds is not None:
        first, last = bounds.groups()
        padded = any(b.lstrip("-").startswith("0") and b.lstrip("-") != "0" for b in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = 1 if int(first) <= int(last) else -1
        return [f"{n:0{width}d}" for n in range(int(first), int(last) + step, step)]
    if _OTHER_RANGE.fullmatch(body):  # braceexpand's steps and letters: not for shard names
        raise ValueError(f"{pattern!r}: {{{body}}} is not a range stoker expands (integers, "
                         "as in {000000..000099}); give a list of paths instead")
    cuts, depth = [-1], 0
    for pos, char in enumerate(body):
        depth += (char == "{") - (char == "}")
        if char == "," and depth == 0:
            cuts.append(pos)
    if len(cuts) == 1:  # no comma: not an expression, kept (inner ones expanded)
        return ["{" + inner + "}" for inner in expand_braces(body)]
    cuts.append(len(body))
    return [path for a, b in itertools.pairwise(cuts) for path in expand_braces(body[a + 1 : b])]


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
