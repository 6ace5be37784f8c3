"""Whole shards fetched ahead into the cache, and samples read from cached shards.

NOTE [ Shard prefetch order ]
A worker learns the upcoming shards from two places, both known before the bytes are needed:

* the plan (``RemoteSource.plan(paths)``): the order the dataset's shards will be read in,
  e.g. the dataset's own shard list for a sequential or rank-contiguous order, or a worker's
  shard list from ``stoker.distributed.shard_list``. Reading any sample of plan entry ``k``
  schedules entries ``k+1 .. k+lookahead_shards`` for download in the background, so the next
  shard is on disk when the sampler reaches it;
* the samples it is asked for: a sample whose shard is not cached fetches that whole shard
  (one GET) before its bytes are returned; threads and processes that want the same shard
  wait for the one download (the cache's per-object lock). Under a global shuffle every batch
  touches many shards: they are fetched once each and then served from disk while the budget
  holds them; with a budget smaller than the dataset, ``fetch="range"`` (one GET per sample)
  is the better choice.

``RemoteSource.prefetch(paths)`` schedules any order explicitly. A prefetch that fails is
dropped silently: the read that needs the shard fetches it itself, with retries, and reports.

A process pins the shards it read last (a shared lock on the cached file, NOTE [ Shard
cache ]), so the shard in use is never evicted under it: ``lookahead_shards + 1`` of them, and
more while they take at most 1/``_PIN_SHARE`` of the budget (and ``_MAX_PINS`` files). Under a
global shuffle each batch reads from many shards, and re-opening and re-locking a shard for each
sample cost more CPU than the read itself (~40% of a cached epoch of 6 KB samples). When a
download finds no room, it lets its own pins go and tries once more. A budget of
``workers x (2 x lookahead_shards + 1)`` shards plus 1/``_PIN_SHARE`` per worker keeps every
download cached.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import OrderedDict

from stoker.storage.cache_locks import release_claim
from stoker.storage.prefetch_threads import PrefetchSource, PrefetchThreads

_PIN_SHARE = 64  # beyond its lookahead, a process pins at most this fraction of the budget
_MAX_PINS = 256  # and keeps at most this many cached files open
_ARRIVAL_START_S = 0.001  # a reader's wait for a download it scheduled to take its lock


def _close_left_open(pid: int, pins: dict[str, tuple[int, int]], claims: dict[str, int]) -> None:
    if pid != os.getpid():  # a parent's, copied by fork: closed by forget_after_fork
        return
    for fd, _ in list(pins.values()):
        with contextlib.suppress(OSError):
            os.close(fd)
    for claim in list(claims.values()):
        release_claim(claim)


class Prefetcher(PrefetchThreads):
    """Per-process state of one ``RemoteSource``'s cache use: pins, plan, download threads."""

    def __init__(self, source: PrefetchSource, lookahead_shards: int) -> None:
        self.source = source
        self.lookahead = max(0, int(lookahead_shards))
        self.plan: list[str] = []
        self._plan_index: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pins = OrderedDict()  # path -> (fd, size)
        self._pinned_bytes = 0
        self._reset_threads()
        # Collected without close(): its pinned files and unstarted claims are closed too (NOTE
        # [ A source dropped without close ] in ``fsspec_handle``; ~8 fds per dropped source).
        weakref.finalize(self, _close_left_open, self._pid, self._pins, self._claims).atexit = False

    def __getstate__(self) -> dict[str, object]:
        return {"source": self.source, "lookahead": self.lookahead, "plan": self.plan,
                "_plan_index": self._plan_index}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reset()

    def forget_after_fork(self) -> None:
        """In a forked child: close the inherited pins (the parent keeps its own locks), drop
        the parent's threads without touching them (NOTE [ Remote handles after fork ]).
        Once a process: a second call (the source opening its filesystem in the child after a
        prefetch there started threads) would drop this process's own threads and claims."""
        if self._pid == os.getpid():
            return
        for fd, _ in self._pins.values():
            os.close(fd)
        self._reset()

    def set_plan(self, paths: list[str]) -> None:
        self.plan = list(paths)
        self._plan_index = {p: k for k, p in enumerate(self.plan)}

    def read_cached(self, path: str, offset: int, length: int | None) -> bytes | None:
        """The bytes from the cached shard (fetching it whole first in ``"shard"`` mode), or
        None when the shard is not cached and cannot be (read it by range). ``length`` None:
        all of it from ``offset``."""
        if self._pid != os.getpid():
            self.forget_after_fork()
        data = self._pread_pinned(path, offset, length)
        if data is not None:
            return data
        size = self.source.known_size(path)
        cache = self.source.cache
        if length is not None and size is not None and cache is not None \
                and self.source.fetch == "shard" and offset + length <= size:
            # Another's download in flight: its bytes as they arrive (NOTE [ Reading a shard
            # while it arrives ] in cache.py); None when there is none. One this process has
            # scheduled may not have started yet: its thread is about to take the lock.
            while True:
                data = cache.read_arriving(path, size, offset, length)
                if data is not None:
                    return data
                with self._lock:
                    pending = path in self._scheduled and path not in self._unclaimed
                if not pending:
                    break
                time.sleep(_ARRIVAL_START_S)
        if not self._pin_cached(path):
            return None
        return self._pread_pinned(path, offset, length)

    def cached_file(self, path: str) -> str | None:
        """The local path of the cached copy (fetched whole first in ``"shard"`` mode), pinned
        while this process reads it, or None when it is not cached and cannot be."""
        if self._pid != os.getpid():
            self.forget_after_fork()
        cache = self.source.cache
        assert cache is not None
        with self._lock:
            pinned = path in self._pins
            if pinned:
                self._pins.move_to_end(path)
        return cache.path_for(path) if pinned or self._pin_cached(path) else None

    def _pin_cached(self, path: str) -> bool:
        """Pin the cached copy of a shard this process holds no pin on (fetched whole first
        in ``"shard"`` mode), and schedule the plan's next shards; False when it is not cached
        and cannot be."""
        cache = self.source.cache
        assert cache is not None
        fd = cache.open_pinned(path)
        expected = self.source.known_size(path)
        if fd is not None and expected is not None:
            st = os.fstat(fd)
            # An old copy of an object written again (NOTE [ A pack written again at the
            # same place ] in formats/tar_index.py): dropped, the store's copy fetched.
            if st.st_size != expected:
                os.close(fd)
                cache.discard(path, st.st_ino)
                fd = None
        if fd is None and self.source.fetch == "shard":
            fd = self._fill_and_pin(path)
        self._ahead_of(path)
        if fd is None:
            return False
        self._pin(path, fd)
        return True

    def _fill_and_pin(self, path: str) -> int | None:
        cache = self.source.cache
        assert cache is not None
        for attempt in range(2):
            if self._fill(path):
                return cache.open_pinned(path)
            if attempt == 0:  # maybe our own pins fill the budget: let them go, try once more
                self._unpin_all()
        return None

    def drop(self, path: str) -> bool:
        """Unpin this process's copy of ``path`` and remove it from the cache (unless it was
        replaced meanwhile): True when this process held one (its reads came from it)."""
        if self._pid != os.getpid():
            self.forget_after_fork()
        fd = self._unpin(path)
        if fd is None:
            return False
        try:
            cache = self.source.cache
            assert cache is not None
            cache.discard(path, os.fstat(fd).st_ino)
        finally:
            os.close(fd)
        return True

    def forget(self, paths: list[str]) -> None:
        """Let go of this process's pins of these objects, and of having seen them cached:
        their content changed (NOTE [ Cached copies named by their content ] in ``cache.py``)."""
        if self._pid != os.getpid():
            self.forget_after_fork()
        for path in paths:
            fd = self._unpin(path)
            if fd is not None:
                os.close(fd)
        with self._lock:
            self._known_cached.difference_update(paths)

    def pinned_pieces(self, paths: list[str]) -> list[str]:
        """The pieces of these objects this process holds pinned (NOTE [ Pieces of large
        objects ] in ``remote.py``)."""
        from stoker.storage.cache import PIECE_MARK

        wanted = set(paths)
        with self._lock:
            return [name for name in self._pins
                    if PIECE_MARK in name and name.partition(PIECE_MARK)[0] in wanted]

    def _unpin(self, path: str) -> int | None:
        """Take this process's pin of ``path`` off its books and return its fd for the caller
        to close (None when it holds none), forgetting that it saw the object cached."""
        with self._lock:
            pin = self._pins.pop(path, None)
            if pin is None:
                return None
            fd, size = pin
            self._pinned_bytes -= size
            self._known_cached.discard(path)
        return fd

    def _unpin_all(self) -> None:
        with self._lock:
            for fd, _ in self._pins.values():
                os.close(fd)
            self._pins.clear()
            self._pinned_bytes = 0

    def _pread_pinned(self, path: str, offset: int, length: int | None) -> bytes | None:
        with self._lock:  # a pin is closed only under this lock: the fd stays ours meanwhile
            pin = self._pins.get(path)
            if pin is None:
                return None
            self._pins.move_to_end(path)
            fd, size = pin
            if length is None:
                length = size - offset
            data = os.pread(fd, length, offset)
        if len(data) != length:
            raise OSError(
                f"{path}: the cached copy has {len(data)} bytes at offset {offset}, "
                f"{length} were asked for: the object is shorter than its index says"
            )
        return data

    def _pin(self, path: str, fd: int) -> None:
        size = os.fstat(fd).st_size
        cache = self.source.cache
        assert cache is not None
        spare = cache.budget_bytes // _PIN_SHARE
        with self._lock:
            if path in self._pins:  # another thread pinned it meanwhile
                os.close(fd)
                return
            self._pins[path] = (fd, size)
            self._pinned_bytes += size
            while len(self._pins) > self.lookahead + 1 and (
                    len(self._pins) > _MAX_PINS or self._pinned_bytes > spare):
                _, (old, old_size) = self._pins.popitem(last=False)
                self._pinned_bytes -= old_size
                os.close(old)

    def _ahead_of(self, path: str) -> None:
        k = self._plan_index.get(path)
        if k is not None and self.lookahead:
            self.schedule(self.plan[k + 1 : k + 1 + self.lookahead])

    def close(self) -> None:
        """Stop the download threads (waiting for downloads in flight) and unpin."""
        if self._pid != os.getpid():
            self.forget_after_fork()
            return
        with self._lock:
            executors = (self._executor, self._fetchers)
            self._executor = self._fetchers = None
            self._scheduled.difference_update(self._unclaimed)
            self._unclaimed.clear()
        for executor in executors:
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:  # claims whose download never started: let others download them
            claims = list(self._claims.values())
            self._claims.clear()  # in place: the finalizer holds this dict, and must not
            self._claims_held = 0  # release these again (their fds may be reused by then)
        for claim in claims:
            release_claim(claim)
        self._unpin_all()
