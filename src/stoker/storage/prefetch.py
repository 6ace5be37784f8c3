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

NOTE [ The main process fetches for its workers ]
Under stoker's loader a map-style dataset defining ``stoker_fetch_for_batch(indices)`` sees
each batch in the main process as it is sent to a worker (the engine's ``_send_task``), and
an iterable one defining ``stoker_fetch_for_stream(worker_id, num_workers, samples)`` learns
how many samples have been asked of that worker (``TarShardStream`` over a pack works out the
shards the worker can have reached and those just past them).
``TarShards`` hands the batch's shards to ``RemoteSource.fetch_for_workers``: each shard not
cached is claimed at once (``ShardCache.claim``: its download lock, taken before the worker
has the batch; at most ``_MAX_CLAIMS`` held: NOTE [ Claims held at once ]) and downloaded on
``_FETCH_FOR_OTHERS_THREADS`` threads of the main process.
The worker reading the batch finds its shards cached, or waits on the lock for the download
in flight; it never makes a request, so it never creates an S3 client: one client per node's
loader instead of one per worker (a botocore client stack is ~20 MiB of private memory and
~60-100 ms of CPU to start in each worker), and the first batch's downloads start before
its worker has started. A shard the main process could not claim (cached, or another process
downloads it) is skipped; one whose download fails for good is released to the worker
waiting for it, which downloads it itself with retries and reports as before. Shards the main
process saw cached are not looked up on disk again while the cache has evicted nothing
(``ShardCache.evictions``, one ``stat`` a batch): each shuffled batch names ~batch_size
shards, and a ``stat`` each made the receive loop wait for the GIL after every one (main
thread CPU 0.25-0.31 -> 0.19-0.22 s an epoch of the measurement below, with obstore). Measured
(20,000 samples in 200 shards of 600 KB from moto with 10 ms per request, shuffled, 2
workers, 3 cold epochs each, before -> after): workers' CPU 1.47-1.65 -> 0.55-0.57 s an
epoch, the main process's 0.31-0.38 -> 1.25-1.38 s (the downloads' botocore work moves
there), peak memory added 56-58 -> 39-43 MiB, samples/s 11.5-12.4k -> 12.2-13.6k, first
batch 0.48-0.53 -> 0.36-0.47 s; the stream over the pack: memory added 83-85 -> 58-65 MiB,
first batch 0.20-0.30 -> 0.17-0.22 s, samples/s 11.5-12.9k -> 10.9-12.1k (its downloads cost
the main process more CPU than they cost the workers: ~6 against ~5 ms each, its threads
contending for one GIL). 8 threads measured best of 2, 4, 8 and 16 (2: 7.8-8.1k samples/s).
With many small shards the main process's GIL is the limit: each download costs it ~5 ms of
CPU here (botocore, the cache), ~200 downloads a second on one core.

NOTE [ Claims held at once ]
A claim is an open lock file. Claiming every uncached shard of every batch in flight held one
fd per shard until a download thread got to it: 1,000 shards of 2 samples, batch 128, 2
workers peaked at ~800 fds in the main process, and under ``ulimit -n 512`` other code's
``open()`` in that process (the training loop's files, sockets) failed with EMFILE. So at most
``_MAX_CLAIMS`` claims are held at once (256: a quarter of the usual soft limit of 1,024 fds,
and more than a cold global shuffle's first batches name: 4 batches of 32 samples over 200
shards need ~120; fewer would send workers to download for themselves, each with an S3 client
of its own); the shards past them wait in line unclaimed, in the order
their batches were sent, and are claimed as downloads end. A worker that reaches one still
waiting downloads it itself (one GET still: it holds the lock, so the main process's claim
later finds it held or cached and skips it), as when a claim fails. Measured (that epoch, from
the S3 test server): the main process's peak fds 779-786 -> 287, the epoch 7.5 -> 6.8-7.3 s;
under ``ulimit -n 512`` no EMFILE (a bound of 32: 64-65 fds, 6.3-6.5 s).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from stoker.storage.cache_locks import release_claim

if TYPE_CHECKING:
    from stoker.storage.cache import ShardCache



class PrefetchSource(Protocol):
    """What the prefetcher reads of its ``RemoteSource`` (which makes one per process): the
    cache it fills and the whole-object GETs it fills it with."""

    @property
    def cache(self) -> ShardCache | None: ...

    @property
    def fetch(self) -> str: ...  # "shard": an uncached shard is fetched whole before a read

    def get_whole(self, path: str) -> bytes: ...

    def get_into(self, path: str, file: str) -> int: ...

    def known_size(self, path: str) -> int | None: ...


_PREFETCH_THREADS = 2
_FETCH_FOR_OTHERS_THREADS = 8  # NOTE [ The main process fetches for its workers ]
_MAX_CLAIMS = 256  # NOTE [ Claims held at once ]
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


class Prefetcher:
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
        self._pins: OrderedDict[str, tuple[int, int]] = OrderedDict()  # path -> (fd, size)
        self._pinned_bytes = 0
        self._executor: ThreadPoolExecutor | None = None
        self._fetchers: ThreadPoolExecutor | None = None  # downloads claimed for others
        self._claims: dict[str, int] = {}  # path -> its claim, until its download starts
        self._claims_held = 0  # claims taken and not yet released: at most _MAX_CLAIMS
        self._unclaimed: OrderedDict[str, int] = OrderedDict()  # path -> size, waiting
        self._scheduled: set[str] = set()
        # Objects this process saw cached, trusted while the cache has evicted nothing since
        # (``_evictions``): under a global shuffle each batch names ~batch_size shards, nearly
        # all cached, and a disk check for each cost the main process's receive loop.
        self._known_cached: set[str] = set()
        self._evictions = -1
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

    def _fill(self, path: str) -> bool:
        """The whole object into the cache: streamed to disk when its size is known, else
        one GET into memory (no request to ask the size: the GET tells)."""
        cache = self.source.cache
        assert cache is not None
        return cache.fill(path, self.source.known_size(path),
                          lambda: self.source.get_whole(path),
                          lambda file: self.source.get_into(path, file))

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

    def schedule(self, paths: list[str]) -> None:
        cache = self.source.cache
        if cache is None:
            return
        if self._pid != os.getpid():  # a parent's threads: they do not run here
            self.forget_after_fork()
        with self._lock:  # a pinned shard is cached and stays so: no disk check for it
            todo = [p for p in paths if p not in self._scheduled and p not in self._pins]
            self._scheduled.update(todo)
            if todo and self._executor is None:
                self._executor = ThreadPoolExecutor(
                    _PREFETCH_THREADS, thread_name_prefix="stoker-prefetch"
                )
            executor = self._executor
        for path in todo:
            assert executor is not None
            executor.submit(self._fetch, path)

    def fetch_claimed(self, paths: list[str]) -> None:
        """Claim each of these objects that is not cached and download it on this process's
        threads: whoever wants it meanwhile waits for that download (NOTE [ The main process
        fetches for its workers ]); past ``_MAX_CLAIMS`` claims held, it waits in line to be
        claimed (NOTE [ Claims held at once ]). Objects of unknown size are left to their
        readers."""
        cache = self.source.cache
        if cache is None:
            return
        if self._pid != os.getpid():
            self.forget_after_fork()
        evictions = cache.evictions()
        if evictions != self._evictions:
            with self._lock:
                self._known_cached.clear()
                self._evictions = evictions
        for path in paths:
            if path in self._known_cached:
                continue
            size = self.source.known_size(path)
            if size is None or path in self._scheduled or path in self._pins:
                continue
            if cache.cached(path):
                self._known_cached.add(path)
                continue
            with self._lock:
                self._scheduled.add(path)
                self._unclaimed[path] = size
        self._claim_waiting(start_threads=True)

    def _claim_waiting(self, start_threads: bool) -> None:
        """Claim the objects waiting in line while fewer than ``_MAX_CLAIMS`` claims are held,
        and queue their downloads (NOTE [ Claims held at once ]). A download thread
        (``start_threads`` False) claims nothing once ``close()`` has taken the threads away."""
        cache = self.source.cache
        assert cache is not None
        while True:
            with self._lock:
                if not self._unclaimed or self._claims_held >= _MAX_CLAIMS:
                    return
                path, size = self._unclaimed.popitem(last=False)
                self._claims_held += 1
            try:
                claim = cache.claim(path)  # None: cached, or another thread or process has it
            except OSError:  # the worker that needs it downloads it itself and reports
                claim = None
            with self._lock:
                if claim is not None and (self._fetchers is not None or start_threads):
                    if self._fetchers is None:
                        self._fetchers = ThreadPoolExecutor(_FETCH_FOR_OTHERS_THREADS,
                                                            thread_name_prefix="stoker-fetch")
                    self._claims[path] = claim
                    # Under the lock: close() takes the threads away under it, before their
                    # shutdown, so this never submits to threads shut down.
                    self._fetchers.submit(self._fetch_claimed, path, size)
                    continue
                self._claims_held -= 1
                self._scheduled.discard(path)
            if claim is not None:
                release_claim(claim)

    def _fetch_claimed(self, path: str, size: int) -> None:
        cache = self.source.cache
        assert cache is not None
        with self._lock:
            claim = self._claims.pop(path, None)
        if claim is None:  # given up by close()
            return
        filled = False
        try:
            filled = cache.fill_claimed(path, claim, size,
                                        lambda file: self.source.get_into(path, file))
        except Exception:  # the reader that needs it, now unblocked, fetches it and reports
            pass
        finally:
            with self._lock:
                self._claims_held -= 1  # fill_claimed released it
                self._scheduled.discard(path)
                if filled:
                    self._known_cached.add(path)
            self._claim_waiting(start_threads=False)

    def _fetch(self, path: str) -> None:
        cache = self.source.cache
        assert cache is not None
        try:
            size = self.source.known_size(path)
            if size is None:
                if not cache.cached(path):
                    self._fill(path)
                return
            # Never waits for another's download (its reader reads it as it arrives: NOTE
            # [ Reading a shard while it arrives ] in cache.py): a thread blocked on that lock
            # kept a worker from exiting until the download ended (1.3 s for a 64 MB shard).
            claim = cache.claim(path)  # None: cached, or being downloaded
            if claim is not None:
                cache.fill_claimed(path, claim, size,
                                   lambda file: self.source.get_into(path, file))
        except Exception:  # NOTE [ Shard prefetch order ]: the read that needs it reports
            pass
        finally:
            with self._lock:
                self._scheduled.discard(path)

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
