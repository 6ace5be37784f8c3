"""``RemoteSource``: a ``ByteSource`` over an object store (``s3://``, ``gs://``, ``https://``,
any ``fsspec`` protocol), and ``open_source``, which picks it or ``LocalSource`` for a path.

Reads are ranged GETs (one per sample: random access) or, with a cache, whole objects kept on
local disk (one GET per shard: see ``stoker.storage.cache`` and ``stoker.storage.prefetch``) or
pieces of them (``remote_pieces``). Every request (``remote_requests``) is retried on transient
errors with backoff and its length verified (``stoker.storage.retry``). Credentials come from
each store's standard chain: nothing is passed unless the caller gives ``storage_options``.

NOTE [ Remote handles after fork ]
fsspec's async filesystems run an asyncio loop on a thread; neither the loop nor the aiohttp
connections survive ``fork`` (the child has no loop thread, and sockets shared with the parent
would interleave bytes). A ``RemoteSource`` therefore opens its filesystem lazily, per process
(it remembers the pid it opened in), on a loop thread of its own, and pickles without it:
workers, forked or spawned, open their own on first use. What a forked child inherits from its
parent's handle is left untouched (closing it there would close the parent's sockets).
The filesystem and its loop thread are opened and closed by ``stoker.storage.fsspec_handle``,
also when a source is collected without ``close()`` (NOTE [ A source dropped without close ]).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Literal

from stoker.storage.cache import ShardCache
from stoker.storage.fsspec_handle import Handle, close_handle, open_filesystem
from stoker.storage.remote_requests import RemoteRequests
from stoker.storage.retry import ReadRequest, RetryPolicy, read_with_retries
from stoker.storage.source import ByteSource, LocalSource

FetchMode = Literal["auto", "shard", "range"]
Client = Literal["auto", "fsspec", "obstore"]

# protocol -> (package, extra) for the install hint.
_BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"),
             "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "remote"),
             "https": ("aiohttp", "remote")}
_LIST_AT_LEAST = 4  # objects of unknown size worth a directory listing
_PIECE_BYTES = None  # NOTE [ Pieces of large objects ]: off unless asked for
_INHERITED: list[object] = []  # NOTE [ Remote handles after fork ]: never closed in a child
_LOCKS_LOCK = threading.Lock()  # guards replacing a source's inherited lock; new in a child


def _new_locks_lock() -> None:
    global _LOCKS_LOCK
    _LOCKS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_locks_lock)


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def _require_fsspec(protocol: str) -> Any:
    package, extra = _BACKENDS.get(protocol, ("fsspec", "remote"))
    try:
        import fsspec

        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        raise ImportError(
            f"reading {protocol}:// URLs needs the {package!r} package ({exc}). Install it "
            f"with: pip install 'stoker[{extra}]'"
        ) from exc
    except ValueError as exc:
        raise ValueError(f"{protocol}://: no fsspec filesystem for this protocol ({exc})") from exc
    return fsspec


def _require_obstore_client(protocol: str, storage_options: dict[str, Any]) -> None:
    """obstore, options it can take, and s3fs for processes forked after obstore started
    (NOTE [ The obstore client ]), all checked without importing s3fs (~0.25 s)."""
    import importlib.util

    from stoker.storage import obstore_files

    obstore_files.require_obstore()
    obstore_files.obstore_config(protocol, storage_options)
    if importlib.util.find_spec("s3fs") is None:
        raise ImportError("client='obstore' also needs s3fs, for workers forked after obstore "
                          "started: pip install 'stoker[obstore]'")


class RemoteSource(RemoteRequests):
    """Objects of one object store, addressed by full URLs.

    ``storage_options`` go to the fsspec filesystem (e.g. ``endpoint_url`` for an
    S3-compatible server: ``client_kwargs={"endpoint_url": ...}``). ``cache_dir`` and
    ``cache_bytes`` keep whole objects on local disk (shared by all processes naming the same
    directory); ``fetch`` says how a sample is read: ``"shard"`` fetches its whole object into
    the cache first, ``"range"`` GETs just its bytes, ``"auto"`` is ``"shard"`` with a cache
    and ``"range"`` without. ``main_downloads``: in ``"shard"`` mode under stoker's loader, its
    main process downloads the shards its workers read (NOTE [ The main process fetches for
    its workers ]); False leaves each worker to download its own (a training loop that keeps
    the main process's GIL busy in Python would slow those downloads). ``piece_bytes``: in
    ``"shard"`` mode, an object over twice this size is cached by pieces of this size for
    reads by range (NOTE [ Pieces of large objects ]); None (the default): whole objects.
    ``client="obstore"`` (``s3://`` only) makes the requests with obstore where it can, from
    the same ``storage_options`` (NOTE [ The obstore client ] in
    ``stoker.storage.obstore_files``); ``"fsspec"`` with fsspec (s3fs for ``s3://``);
    ``"auto"`` (the default) with obstore where it reads exactly what s3fs would, else with
    fsspec (NOTE [ The client by default ]).
    """

    def __init__(
        self,
        protocol: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        cache_dir: str | None = None,
        cache_bytes: int | None = None,
        fetch: FetchMode = "auto",
        lookahead_shards: int = 2,
        main_downloads: bool = True,
        client: Client = "auto",
        piece_bytes: int | None = _PIECE_BYTES,
    ) -> None:
        if client == "auto":
            from stoker.storage.obstore_files import auto_client

            client = "obstore" if auto_client(protocol, dict(storage_options or {})) \
                == "obstore" else "fsspec"
        if client == "obstore":
            _require_obstore_client(protocol, dict(storage_options or {}))
        elif client == "fsspec":
            _require_fsspec(protocol)
        else:
            raise ValueError(f"client={client!r}: expected 'auto', 'fsspec' or 'obstore'")
        if piece_bytes is not None and (not isinstance(piece_bytes, int) or piece_bytes < 1):
            raise ValueError(f"piece_bytes={piece_bytes!r}: expected a positive int (bytes), "
                             "or None to cache whole objects")
        if fetch not in ("auto", "shard", "range"):
            raise ValueError(f"fetch={fetch!r}: expected 'auto', 'shard' or 'range'")
        if (cache_dir is None) != (cache_bytes is None):
            raise ValueError(
                f"cache_dir={cache_dir!r}, cache_bytes={cache_bytes!r}: give both (a local "
                "directory and the bytes it may hold) or neither"
            )
        if fetch == "shard" and cache_dir is None:
            raise ValueError("fetch='shard' keeps whole objects on disk: give cache_dir and "
                             "cache_bytes, or use fetch='range'")
        self.protocol = protocol
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.cache = None if cache_dir is None else ShardCache(cache_dir, int(cache_bytes or 0))
        self.fetch: FetchMode = fetch if fetch != "auto" else (
            "range" if self.cache is None else "shard")
        self.lookahead_shards = lookahead_shards
        self.main_downloads = bool(main_downloads)
        self.client: Client = client
        self.piece_bytes = piece_bytes
        # Object sizes, asked once: kept on the source (not the per-process handle), so
        # workers forked or unpickled after the dataset was opened never ask again.
        self._sizes: dict[str, int] = {}
        self._handle: Handle | None = None
        self._lock, self._lock_pid = threading.Lock(), os.getpid()
        from stoker.storage.prefetch import Prefetcher

        self._prefetcher = Prefetcher(self, lookahead_shards)

    # ------------------------------------------------------------------ pickling, per process
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handle"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._lock_pid = threading.Lock(), os.getpid()

    def _process_lock(self) -> threading.Lock:
        """This process's lock: one inherited through fork may have been held by a parent's
        thread (opening the filesystem), which does not exist here to release it."""
        if self._lock_pid != os.getpid():
            with _LOCKS_LOCK:
                if self._lock_pid != os.getpid():
                    self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def __repr__(self) -> str:
        cache = "" if self.cache is None else f", cache={self.cache!r}"
        return f"RemoteSource({self.protocol!r}, fetch={self.fetch!r}{cache})"

    @property
    def connected(self) -> bool:
        """Whether this process has opened its own filesystem (its client and connections):
        a worker the main process fetches for never does (NOTE [ The main process fetches
        for its workers ])."""
        handle = self._handle
        return handle is not None and handle.pid == os.getpid()

    def _fs(self) -> Handle:
        handle = self._handle
        if handle is not None and handle.pid == os.getpid():
            return handle
        with self._process_lock():
            if self._handle is not None and self._handle.pid != os.getpid():
                _INHERITED.append(self._handle)  # a parent's: leave it be
                self._handle = None
                self._prefetcher.forget_after_fork()
            if self._handle is None:
                self._handle = self._open()
            return self._handle

    def _open(self) -> Handle:
        from stoker.storage import obstore_files

        if self.client == "obstore" and obstore_files.usable_here():
            return Handle(os.getpid(),
                          obstore_files.ObstoreFiles(self.protocol, self.storage_options))
        _require_fsspec(self.protocol)
        return open_filesystem(self, self.protocol, self.storage_options)

    def close(self) -> None:
        """Close this process's connections and loop thread (reopened on next use)."""
        self._prefetcher.close()
        with self._process_lock():
            handle, self._handle = self._handle, None
        if handle is None or handle.pid != os.getpid():
            return
        if handle.loop is None:  # a synchronous filesystem: only obstore's has stores to drop
            from stoker.storage.obstore_files import ObstoreFiles

            if isinstance(handle.fs, ObstoreFiles):
                handle.fs.close()
            return
        close_handle(handle)

    # ------------------------------------------------------------------ ByteSource
    def size(self, path: str) -> int:
        known = self._sizes.get(path)
        if known is None:
            handle = self._fs()
            known = self._sizes[path] = read_with_retries(
                ReadRequest(path), lambda: int(handle.fs.size(path)), self.retry, None
            )
        return known

    def learn_sizes(self, paths: list[str]) -> None:
        """Ask the sizes of many objects at once, for ``size``: one listing of each directory
        holding several of them (a request per 1,000 objects on S3) instead of a request per
        object. Best effort: an object the listing does not show (or a store that does not
        list, or refuses to) is asked on its own when its size is needed."""
        missing = [p for p in dict.fromkeys(paths) if p not in self._sizes]
        if self.protocol in ("http", "https") or len(missing) < _LIST_AT_LEAST:
            return  # HTTP servers list nothing reliable; for a few, a listing saves nothing
        handle = self._fs()
        stripped = {handle.fs._strip_protocol(p): p for p in missing}
        # Every file listed is kept (indexes beside shards), under the URL it was given or
        # under the protocol prefix the given URLs share.
        prefix = missing[0][: len(missing[0]) - len(handle.fs._strip_protocol(missing[0]))]
        for directory in sorted({name.rsplit("/", 1)[0] for name in stripped}):
            try:
                entries: list[dict[str, Any]] = read_with_retries(
                    ReadRequest(directory), functools.partial(handle.fs.ls, directory,
                                                              detail=True), self.retry, None)
            except OSError:  # listing refused or failing: each size is asked when needed
                continue
            for entry in entries:
                name = entry.get("name", "")
                if entry.get("type") == "file":
                    self._sizes[stripped.get(name, prefix + name)] = int(entry["size"])

    def expect_sizes(self, sizes: dict[str, int]) -> None:
        """Sizes a dataset's manifest gives. In ``"shard"`` mode they are taken as they are:
        each object is checked when it is downloaded whole (one of another size fails then,
        named), and no request is spent on them. By range, a shorter object would only show
        as reads cut short, so its real size is learnt now (``learn_sizes``: one listing)."""
        if self.fetch == "range":
            self.learn_sizes(list(sizes))
            return
        for path, size in sizes.items():
            self._sizes.setdefault(path, int(size))

    def expect_versions(self, versions: dict[str, str]) -> None:
        """Tags of the objects' content, from a dataset's indexes: each is cached under its URL
        and its tag, so a cached copy of other content (an old pack written over) is never read
        for it (NOTE [ Cached copies named by their content ] in ``storage/cache.py``)."""
        if self.cache is None:
            return
        changed = self.cache.expect_versions(versions)
        if changed:
            self._prefetcher.forget(changed + self._prefetcher.pinned_pieces(changed))

    def read(self, path: str) -> bytes:
        """The whole object: through the cache when there is one (in ``"shard"`` mode fetched
        into it first, and the plan's next objects fetched ahead), else one GET."""
        if self.cache is not None and (self.fetch == "shard" or self.local_path(path)):
            data = self._prefetcher.read_cached(path, 0, None)
            if data is not None:
                return data
        return self.get_whole(path)

    def fetch_local(self, path: str) -> str | None:
        """A local file holding the whole object, for reading it in place (e.g. mapped): its
        cached copy, fetched first in ``"shard"`` mode (and the plan's next objects fetched
        ahead); None without a cache, or when it cannot be cached (read it instead)."""
        if self.cache is None:
            return None
        return self._prefetcher.cached_file(path)

    def drop_cached(self, path: str) -> bool:
        """Remove the cached copy this process read ``path`` from, found not to be what the
        dataset's index says (NOTE [ A pack written again at the same place ] in
        ``formats/tar_index.py``), and the pieces of it it holds: True when there was one, so
        reading again reads the store."""
        if self.cache is None:
            return False
        names = [path] + self._prefetcher.pinned_pieces([path])
        return any([self._prefetcher.drop(name) for name in names])  # a list: drop them all

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if self.cache is not None:
            if self._pieced(path) is not None:
                return self._read_pieces(path, offset, length)
            data = self._prefetcher.read_cached(path, offset, length)
            if data is not None:
                return data
        return self.get_range(path, offset, length)

    @property
    def fetches_whole(self) -> bool:
        """Whether a read by range of an uncached object fetches it (or its pieces) into the
        cache first: ``"shard"`` mode."""
        return self.fetch == "shard" and self.cache is not None

    def known_size(self, path: str) -> int | None:
        """The object's (or piece's) size if already known (asked, listed, or read whole),
        else None."""
        piece = self._piece_span(path)
        if piece is not None:
            return piece[2] - piece[1]
        return self._sizes.get(path)

    def local_path(self, path: str) -> str | None:
        if self.cache is None:
            return None
        local = self.cache.path_for(path)
        return local if os.path.exists(local) else None

    # ------------------------------------------------------------------ fetching ahead
    def plan(self, paths: list[str]) -> None:
        """The order shards will be read in: reading one fetches the next ``lookahead_shards``
        of this list into the cache in the background (NOTE [ Shard prefetch order ])."""
        self._prefetcher.set_plan(paths)

    def fetch_for_workers(self, paths: list[str]) -> None:
        """In ``"shard"`` mode, download these whole objects into the cache in the background
        on this process's threads, each claimed first, so that a process wanting one meanwhile
        waits for this download instead of making its own (NOTE [ The main process fetches for
        its workers ]). Objects cached, being downloaded, or of unknown size are skipped."""
        if self.fetch == "shard" and self.main_downloads:
            self._prefetcher.fetch_claimed(paths)

    def prefetch(self, paths: list[str]) -> None:
        """Fetch these whole objects into the cache in the background, in this order."""
        self._prefetcher.schedule(paths)


_OPTIONS = ("storage_options", "retry", "cache_dir", "cache_bytes", "fetch", "lookahead_shards",
            "main_downloads", "client", "piece_bytes")


def open_source(url_or_path: str, **options: Any) -> ByteSource:
    """The ``ByteSource`` for a path or URL: ``LocalSource`` for a local path,
    ``RemoteSource`` (fsspec) for a URL, ``file://`` included. ``options`` are
    ``RemoteSource``'s keyword arguments; a local path needs none and ignores them, so one
    call serves both."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"open_source() got unknown options {unknown}; expected some of {_OPTIONS}")
    if "://" not in url_or_path:
        return LocalSource()
    storage_options = options.pop("storage_options", None)
    return RemoteSource(_protocol(url_or_path), storage_options, **options)
