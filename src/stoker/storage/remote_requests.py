"""The GETs of a ``RemoteSource``: a range, a prefix, a whole object or piece, into memory
or into a local file; each retried with backoff and its length verified (``retry.py``)."""

from __future__ import annotations

import os
from typing import Any

from stoker.storage.exit_watch import exit_callback
from stoker.storage.fsspec_handle import Handle
from stoker.storage.remote_pieces import RemotePieces
from stoker.storage.retry import ReadRequest, RetryPolicy, read_with_retries

# get_into reads objects up to this size at once (less CPU than streaming them); larger ones
# stream to disk, so readers have their first bytes early (NOTE [ Reading a shard while it
# arrives ] in cache.py: 2 MiB arrive in ~20 ms at 100 MB/s).
_READ_WHOLE_MAX = 2 << 20


class RemoteRequests(RemotePieces):
    """``RemoteSource``'s requests, through this process's filesystem (``_fs``)."""

    retry: RetryPolicy

    def _fs(self) -> Handle:  # ``RemoteSource``'s: this process's filesystem, opened on first use
        raise NotImplementedError

    def get_range(self, path: str, offset: int, length: int) -> bytes:
        """One ranged GET (retried, length verified), bypassing the cache."""
        handle = self._fs()
        return read_with_retries(
            ReadRequest(path, offset, length),
            lambda: handle.fs.cat_file(path, start=offset, end=offset + length),
            self.retry,
            length,
        )

    def read_prefix(self, path: str, length: int) -> bytes:
        """The object's first ``length`` bytes, or all of it when it is shorter: one GET
        (retried), not through the cache. A body cut short raises (its Content-Length), so
        fewer bytes mean a shorter object."""
        handle = self._fs()
        data: bytes = read_with_retries(
            ReadRequest(path, 0, length),
            lambda: handle.fs.cat_file(path, start=0, end=length), self.retry, None)
        data = data[:length]  # a server that ignores Range sends the whole object
        if len(data) < length:
            self._sizes.setdefault(path, len(data))
        return data

    def get_whole(self, path: str) -> bytes:
        """The whole object (or piece) in one GET (retried; its length checked against its
        size when that is known, else remembered)."""
        piece = self._piece_span(path)
        if piece is not None:
            return self.get_range(piece[0], piece[1], piece[2] - piece[1])
        handle = self._fs()
        size = self._sizes.get(path)
        if size is None:  # start=0: without a range s3fs asks the size first
            data: bytes = read_with_retries(
                ReadRequest(path), lambda: handle.fs.cat_file(path, start=0), self.retry, None)
            self._sizes[path] = len(data)
            return data
        return read_with_retries(
            ReadRequest(path, 0, size),
            lambda: handle.fs.cat_file(path, start=0, end=size) if size else b"",
            self.retry,
            size,
        )

    def get_into(self, path: str, file: str) -> int:
        """The whole object into the local ``file`` by one GET (retried; its length checked
        against its size when that is known, else remembered); returns its length. Streamed,
        never held in memory whole, unless it is known to be at most ``_READ_WHOLE_MAX``
        bytes: then read at once and written (fsspec's streamed get reads 64 KiB at a time,
        which took ~1.5-2x the CPU of one read for a 600 KB object). A piece's name: its
        bytes, by one ranged GET."""
        piece = self._piece_span(path)
        if piece is not None:
            return self._get_piece_into(*piece, file)
        handle = self._fs()
        size = self._sizes.get(path)

        def fetch() -> int:
            if size == 0:  # as get_whole: no request (a range of an empty object is refused)
                open(file, "wb").close()
                return 0
            if size is not None and size <= _READ_WHOLE_MAX:
                # One byte past the end: a longer object shows. A body cut short raises (its
                # Content-Length), so fewer bytes mean a shorter object.
                read = getattr(handle.fs, "cat_buffer", handle.fs.cat_file)  # obstore: no copy
                data = read(path, start=0, end=size + 1)
                if len(data) != size:
                    raise _changed(len(data) if len(data) < size else f"over {size}", size)
                with open(file, "wb") as f:
                    return f.write(data)
            # A body cut short raises (its Content-Length). Front to back: readers read what
            # has arrived (NOTE [ Reading a shard while it arrives ] in cache.py).
            handle.fs.get_file(path, file, callback=exit_callback(),  # NOTE [ A download
                               **_front_to_back(handle.fs))  # gives up at exit ]
            got = os.path.getsize(file)
            if size is not None and got != size:  # a whole other object: not retried
                raise _changed(got, size)
            return got

        request = ReadRequest(path) if size is None else ReadRequest(path, 0, size)
        got: int = read_with_retries(request, fetch, self.retry, None)
        self._sizes[path] = got
        return got

    def _get_piece_into(self, path: str, start: int, end: int, file: str) -> int:
        handle = self._fs()

        def fetch() -> int:
            read = getattr(handle.fs, "cat_buffer", handle.fs.cat_file)  # obstore: no copy
            data = read(path, start=start, end=end)
            if len(data) != end - start:
                raise OSError(f"body cut short: {len(data)} of {end - start} bytes")
            with open(file, "wb") as f:
                return f.write(data)

        got: int = read_with_retries(ReadRequest(path, start, end - start), fetch, self.retry,
                                     None)
        return got


_FRONT_TO_BACK: dict[type, dict[str, Any]] = {}  # per filesystem class


def _front_to_back(fs: Any) -> dict[str, Any]:
    """``get_file``'s arguments that make it write the file front to back: s3fs downloads an
    object over 50 MB in parts at once, each written at its offset, which would leave holes
    under a file's size (NOTE [ Reading a shard while it arrives ] in ``cache.py``)."""
    kind = type(fs)
    found = _FRONT_TO_BACK.get(kind)
    if found is None:
        import inspect

        try:
            parameters = inspect.signature(getattr(fs, "_get_file", fs.get_file)).parameters
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        found = _FRONT_TO_BACK[kind] = (
            {"max_concurrency": 1} if "max_concurrency" in parameters else {})
    return found


def _changed(got: int | str, expected: int) -> ValueError:
    """An object of another size than its listing or manifest said: another object, so a
    permanent error (not retried)."""
    return ValueError(
        f"the object is {got} bytes, its listing or the dataset's manifest says {expected}: "
        "it changed since. If the pack was written again since the dataset was opened, open "
        "the dataset again; else index it again (stoker pack)")
