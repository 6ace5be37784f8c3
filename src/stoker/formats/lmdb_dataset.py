"""``LMDBDataset``: an LMDB database as a map-style dataset, read with the ``lmdb`` package (the
``lmdb`` extra). Sample ``i`` is the value of the ``i``-th key (the database's key order, or the
``keys`` given); LMDB reads are memory-mapped, so the database must be a local file (or a
complete cached copy a ``ByteSource`` can name). Each process opens its own read-only
environment (an LMDB environment must not cross a fork, and ``lmdb`` refuses to open one path
twice in a process): one per path per process, shared by every dataset over that path; a forked
worker closes the copy it inherited before opening its own."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset

from stoker.formats._common import default_source, require
from stoker.sharing.shared_list import SharedBytesList
from stoker.storage import ByteSource


class _Env:
    """An open environment, closed when no dataset in this process holds it any more."""

    def __init__(self, path: str) -> None:
        lmdb = require("lmdb", "lmdb", "stoker.formats.LMDBDataset")
        self.pid = os.getpid()
        self.env = lmdb.open(
            path, subdir=os.path.isdir(path), readonly=True, lock=False, readahead=False,
            meminit=False, max_readers=1024,
        )

    def __del__(self) -> None:
        env = getattr(self, "env", None)  # None: lmdb.open raised
        if env is not None:
            env.close()


_ENVS: weakref.WeakValueDictionary[str, _Env] = weakref.WeakValueDictionary()
_ENVS_LOCK = threading.Lock()


def _environment(path: str) -> _Env:
    path = os.path.realpath(path)  # "db", "./db/", a symlink: lmdb refuses a second open
    with _ENVS_LOCK:
        handle = _ENVS.get(path)
        if handle is not None and handle.pid == os.getpid():
            return handle
        if handle is not None:  # inherited through fork: never read through it
            handle.env.close()
        handle = _ENVS[path] = _Env(path)
        return handle


class LMDBDataset(Dataset[Any]):
    """Values of an LMDB database, by position; ``transform`` applies to the value's bytes."""

    def __init__(
        self,
        path: str,
        *,
        keys: Sequence[bytes] | None = None,
        transform: Callable[[bytes], Any] | None = None,
        source: ByteSource | None = None,
    ) -> None:
        require("lmdb", "lmdb", "stoker.formats.LMDBDataset")
        source = default_source(path, source)
        local = source.local_path(path)
        if local is None:
            raise ValueError(
                f"{path}: LMDB reads a memory-mapped local file and this source has none; "
                "copy the database to local disk (or use a source that caches whole files)"
            )
        self.path, self.transform = local, transform
        self._handle: _Env | None = None
        if keys is None:
            with self._open().begin() as txn:
                keys = list(txn.cursor().iternext(keys=True, values=False))
        self.keys = SharedBytesList(keys)

    def _open(self) -> Any:
        handle = self._handle
        if handle is None or handle.pid != os.getpid():
            handle = self._handle = _environment(self.path)
        return handle.env

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None}

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> Any:
        key = self.keys[index]
        with self._open().begin(buffers=False) as txn:
            value = txn.get(key)
        if value is None:
            raise KeyError(f"{self.path}: key {key!r} (sample {index}) is not in the database")
        return value if self.transform is None else self.transform(value)
