"""``ByteSource``: the one interface record formats read through; ``ByteSourceExtras``: what a
source may also offer, each member on its own; and the local implementation.

A source is addressed by the paths (or URLs) the user gave. Every method is safe to call from
several threads at once, and a source pickles (workers receive it with the dataset): process-local
handles are opened lazily, never pickled.

NOTE [ Optional source members ]
A reader needs only ``ByteSource``'s four methods; ``RemoteSource`` offers more (sizes from a
manifest, fetching ahead, reads that skip its cache), and a user's source may offer any of them.
Each member of ``ByteSourceExtras`` is optional on its own: a reader asks for one with
``extra`` (the bound method, or None), ``extra_value`` (an attribute, or a default) or
``offers``, naming it by the protocol's member (``extra(source, ByteSourceExtras.get_whole)``),
so the name is written once, here, and mypy checks the call. Asking is ``getattr``: a source
that has the attribute offers it, whatever its class. ``tests/unit/test_contracts.py`` fails
on a member a reader uses that neither protocol declares.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from stoker.storage.cache import ShardCache

_P = ParamSpec("_P")
_R = TypeVar("_R")


@runtime_checkable
class ByteSource(Protocol):
    """Bytes of named objects: whole, by range, or as a local file when one exists.

    Readers also use what ``ByteSourceExtras`` declares when a source has it (``RemoteSource``
    has all of it)."""

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


class ByteSourceExtras(Protocol):
    """What a ``ByteSource`` may also offer; readers use each member a source has, on its own
    (NOTE [ Optional source members ]). ``RemoteSource`` offers them all; a source with none
    of them is read through ``ByteSource``'s methods alone, with the same samples."""

    # -- what a dataset's manifest and indexes tell the source
    def known_size(self, path: str) -> int | None:
        """The object's size if already known without a request, else None (readers check a
        shard against its index with it instead of asking ``size``)."""
        ...

    def learn_sizes(self, paths: list[str]) -> None:
        """Ask the sizes of these objects at once (a listing of their directories), so that
        ``known_size`` has them; best effort: one not learnt is asked alone when needed."""
        ...

    def expect_sizes(self, sizes: dict[str, int]) -> None:
        """The objects' sizes as a dataset's manifest gives them, so none is asked one by one.
        A reader that finds this treats the source as remote (sizes from the manifest, the
        main process fetching for its workers)."""
        ...

    def expect_versions(self, versions: dict[str, str]) -> None:
        """A tag of each object's content (a digest of its index), so no cached copy of other
        content is read for it (NOTE [ Cached copies named by their content ] in ``cache.py``)."""
        ...

    # -- reads around a cache
    def read_prefix(self, path: str, length: int) -> bytes:
        """The object's first ``length`` bytes, or all of it when it is shorter; asked at once
        beside the manifest (NOTE [ The file of indexes alongside the manifest ] in
        ``formats/tar_manifest.py``)."""
        ...

    def get_whole(self, path: str) -> bytes:
        """The whole object from its store, never from a cache (manifests, indexes: NOTE [ A
        pack written again at the same place ] in ``formats/tar_index.py``)."""
        ...

    def fetch_local(self, path: str) -> str | None:
        """A local file holding the whole object, fetched first if need be, to map it; None
        when it cannot be had (the reader reads it instead)."""
        ...

    def drop_cached(self, path: str) -> bool:
        """Drop the cached copy this process read ``path`` from (its bytes disagreed with the
        index): True when there was one, so reading again reads the store."""
        ...

    # -- fetching ahead (NOTE [ Shard prefetch order ] in prefetch.py)
    def plan(self, paths: list[str]) -> None:
        """The order these objects will be read in; reading one fetches the next ahead."""
        ...

    def prefetch(self, paths: list[str]) -> None:
        """Fetch these whole objects in the background, in this order."""
        ...

    def pieces_of(self, path: str, offset: int, length: int) -> list[str]:
        """The names of what holds these bytes of ``path`` in the cache: pieces of a large
        object, else ``[path]`` (NOTE [ Pieces of large objects ] in ``remote.py``); a
        reader hands them to ``fetch_for_workers`` and ``prefetch`` instead of the object."""
        ...

    def fetch_for_workers(self, paths: list[str]) -> None:
        """In the loader's main process: download these objects for the workers that will
        read them (NOTE [ The main process fetches for its workers ] in ``prefetch_threads.py``)."""
        ...

    @property
    def fetches_whole(self) -> bool:
        """Whether a read by range of an object not cached fetches it whole (or its pieces)
        into the cache first (``"shard"`` mode), where a reader that reads a shard's samples
        by range gets them as the download brings them (NOTE [ Reading a shard while it
        arrives ] in ``cache.py``) instead of a GET each."""
        ...

    @property
    def lookahead_shards(self) -> int:
        """How many objects past the one being read are fetched ahead (readers: 0 without)."""
        ...

    @property
    def cache(self) -> ShardCache | None:
        """The local cache whole objects are kept in, or None (its ``budget_bytes`` tells a
        reader whether a shuffled order outgrows it: NOTE [ A cache the order thrashes ] in
        ``formats/cache_thrash.py``)."""
        ...


def _member_name(member: Any) -> str:
    """The attribute a ``ByteSourceExtras`` member (a function, or a property) stands for."""
    return str(getattr(member, "fget", member).__name__)


def extra(
    source: ByteSource, member: Callable[Concatenate[Any, _P], _R]
) -> Callable[_P, _R] | None:
    """``source``'s own (bound) method for ``member``, a method of ``ByteSourceExtras``
    (``extra(source, ByteSourceExtras.get_whole)``), or None when it has none."""
    found: Callable[_P, _R] | None = getattr(source, _member_name(member), None)
    return found


def extra_value(source: ByteSource, member: Callable[[Any], _R], default: _R) -> _R:
    """``source``'s value of ``member``, a property of ``ByteSourceExtras``
    (``extra_value(source, ByteSourceExtras.cache, None)``), or ``default`` without one."""
    found: _R = getattr(source, _member_name(member), default)
    return found


def offers(source: ByteSource, member: object) -> bool:
    """Whether ``source`` has ``member`` of ``ByteSourceExtras`` at all."""
    return hasattr(source, _member_name(member))


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
