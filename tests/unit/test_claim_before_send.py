"""NOTE [ A claim taken before the batch is sent ] (``storage/prefetch_threads.py``):
``fetch_claimed`` returns only once every object it put in line is claimed, even one that a
download thread, ending meanwhile, took off the line and has not claimed yet. The engine
sends the batch right after it returns; a claim still to come let the worker's read-ahead
claim the object first and open an S3 client of its own."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from _prefetch_fakes import ShardSource
from stoker.storage import prefetch

_WAIT_S = 30.0


class _WatchedLock:
    """A lock that says when a thread had to wait for it."""

    def __init__(self, contended: threading.Event) -> None:
        self._lock, self._contended = threading.Lock(), contended

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self._contended.set()
            assert self._lock.acquire(timeout=_WAIT_S), "the claiming lock was never let go"

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Cache:
    """Claims are real fds. The download of "a" ends when the test lets it; the claim of "b"
    (taken by the thread that downloaded "a") waits for the test; "c" is looked up only after
    that thread has taken "b" off the line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.go_a, self.b_taken, self.go_b = (threading.Event() for _ in range(3))
        self.claimed: list[str] = []

    def evictions(self) -> int:
        return 0

    def cached(self, path: str) -> bool:
        if path == "c":  # "b" is in line now: the download of "a" ends and takes it
            self.go_a.set()
            assert self.b_taken.wait(_WAIT_S), "no download thread took b off the line"
        return False

    def claim(self, path: str) -> int:
        if path == "b":
            self.b_taken.set()
            assert self.go_b.wait(_WAIT_S), "the test never let b be claimed"
        self.claimed.append(path)
        return os.open(self.root / path, os.O_CREAT | os.O_RDWR, 0o600)

    def fill_claimed(self, path: str, claim: int, size: int, fill: Any) -> bool:
        if path == "a":
            assert self.go_a.wait(_WAIT_S), "the test never let a's download end"
        prefetch.release_claim(claim)
        return True


def test_fetch_claimed_returns_after_a_download_thread_claims_what_it_took_off_the_line(
        tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    cache = _Cache(tmp_path)
    pf = prefetch.Prefetcher(ShardSource(cache), 0)
    contended, progress, returned = threading.Event(), threading.Event(), threading.Event()
    pf._claiming = _WatchedLock(contended)  # type: ignore[assignment]
    watch = threading.Thread(target=lambda: contended.wait(_WAIT_S) and progress.set())
    watch.start()
    try:
        pf.fetch_claimed(["a"])  # claimed; its download waits

        def second_batch() -> None:
            pf.fetch_claimed(["b", "c"])
            returned.set()
            progress.set()

        main = threading.Thread(target=second_batch)
        main.start()
        assert progress.wait(_WAIT_S)
        assert not returned.is_set(), (
            "fetch_claimed returned while b, taken off the line by a download thread, was "
            f"not claimed yet (claimed: {cache.claimed})")
        cache.go_b.set()
        main.join(_WAIT_S)
        assert returned.is_set() and cache.claimed == ["a", "b", "c"]
    finally:
        cache.go_a.set()
        cache.go_b.set()
        contended.set()
        watch.join(_WAIT_S)
        pf.close()
    assert set(threading.enumerate()) == threads_before
