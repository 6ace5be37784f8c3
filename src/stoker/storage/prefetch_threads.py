"""The download threads of a process's ``Prefetcher``: shards fetched ahead of the plan
(NOTE [ Shard prefetch order ] in ``prefetch.py``) or claimed and fetched for the workers.

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

import os
import threading
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


class PrefetchThreads:
    """``Prefetcher``'s downloads on its threads, and what they are doing."""

    source: PrefetchSource
    _pid: int
    _lock: threading.Lock
    _pins: OrderedDict[str, tuple[int, int]]

    def _reset_threads(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._fetchers: ThreadPoolExecutor | None = None  # downloads claimed for others
        self._claims: dict[str, int] = {}  # path -> its claim, until its download starts
        self._claims_held = 0  # claims taken and not yet released: at most _MAX_CLAIMS
        # Held from taking an object off the line until its claim is taken or given up
        # (NOTE [ A claim taken before the batch is sent ]).
        self._claiming = threading.Lock()
        self._unclaimed: OrderedDict[str, int] = OrderedDict()  # path -> size, waiting
        self._scheduled: set[str] = set()
        # Objects this process saw cached, trusted while the cache has evicted nothing since
        # (``_evictions``): under a global shuffle each batch names ~batch_size shards, nearly
        # all cached, and a disk check for each cost the main process's receive loop.
        self._known_cached: set[str] = set()
        self._evictions = -1

    def forget_after_fork(self) -> None: ...  # ``Prefetcher``'s: a forked child starts afresh

    def _fill(self, path: str) -> bool:
        """The whole object into the cache: streamed to disk when its size is known, else
        one GET into memory (no request to ask the size: the GET tells)."""
        cache = self.source.cache
        assert cache is not None
        return cache.fill(path, self.source.known_size(path),
                          lambda: self.source.get_whole(path),
                          lambda file: self.source.get_into(path, file))

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

    # NOTE [ A claim taken before the batch is sent ]
    # fetch_claimed returns once every object it put in line is claimed (or found cached or
    # held), up to _MAX_CLAIMS: the engine sends the batch right after it, and the worker's
    # own read-ahead (NOTE [ A stream of pieces ] in formats/tar_stream.py) claims what is
    # not claimed yet, making that worker an S3 client of its own. A download thread that
    # ends also claims from the line (_claim_waiting); without _claiming, one that had taken
    # an object off the line and was descheduled before claiming it (38 ms, on 2 cores
    # under load) left the main thread finding the line empty and returning; the worker took
    # the claim first (1 run in 100-300 of test_remote_pieces' stream test beside busy processes).

    def _claim_waiting(self, start_threads: bool) -> None:
        """Claim the objects waiting in line while fewer than ``_MAX_CLAIMS`` claims are held,
        and queue their downloads (NOTE [ Claims held at once ]). A download thread
        (``start_threads`` False) claims nothing once ``close()`` has taken the threads away.
        One thread at a time (NOTE [ A claim taken before the batch is sent ])."""
        with self._claiming:
            self._claim_each_waiting(start_threads)

    def _claim_each_waiting(self, start_threads: bool) -> None:
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

