"""``Prefetcher.close()`` lets go of each claim whose download never started exactly once: the
finalizer that closes what a collected prefetcher left open must not release them again (a
second close of a claim's fd closes whatever file reused its number since)."""

from __future__ import annotations

import gc
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from _prefetch_fakes import ShardSource
from stoker.storage import prefetch, prefetch_threads

_WAIT_S = 30.0


class _Cache:
    def __init__(self, root: Path, running: threading.Event, go: threading.Event,
                 released: Counter[int]) -> None:
        self._root, self._running, self._go, self._released = root, running, go, released

    def evictions(self) -> int:
        return 0

    def cached(self, path: str) -> bool:
        return False

    def claim(self, path: str) -> int:
        return os.open(self._root / path, os.O_CREAT | os.O_RDWR, 0o600)  # a real fd

    def fill_claimed(self, path: str, claim: int, size: int, fill: Any) -> bool:
        self._running.set()
        assert self._go.wait(_WAIT_S), "the test never let the download finish"
        prefetch.release_claim(claim)  # as the real cache does when the download ends
        return False


def test_close_releases_each_unstarted_claim_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released: Counter[int] = Counter()

    def release(fd: int) -> None:
        released[fd] += 1
        if released[fd] == 1:
            os.close(fd)

    running, go = threading.Event(), threading.Event()

    class Pool(ThreadPoolExecutor):
        # Queued downloads are cancelled before the running one is let go: the claims of
        # those that never started are the ones close() gives up itself.
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            super().shutdown(wait=False, cancel_futures=cancel_futures)
            go.set()
            super().shutdown(wait=wait)

    for module in (prefetch, prefetch_threads):
        monkeypatch.setattr(module, "release_claim", release)
    monkeypatch.setattr(prefetch_threads, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(prefetch_threads, "_FETCH_FOR_OTHERS_THREADS", 1)
    pf = prefetch.Prefetcher(ShardSource(_Cache(tmp_path, running, go, released)), 0)
    pf.fetch_claimed(["a", "b", "c", "d"])  # "a" downloads; b, c, d wait, claimed
    assert running.wait(_WAIT_S)
    pf.close()
    assert sum(released.values()) == 4  # all four claims given up, once each so far
    del pf
    gc.collect()  # the finalizer runs: it must find nothing left to release
    assert released and all(n == 1 for n in released.values()), released
