"""ShardCache across real processes: locks across fork (NOTE [ Cache locks across fork ]), a
real forked child and a real download lock held by a thread of its parent; the partial file of
a download killed with SIGKILL, or still running in another process (NOTE [ Partial files of
dead downloads ])."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from stoker.storage import ShardCache


def _blob(k: int, size: int = 1000) -> bytes:
    return bytes([k % 256]) * size


def _fill_in_child(directory: str, results: Any) -> None:
    cache = ShardCache(directory, budget_bytes=10_000)
    results.put(cache.fill("s3://b/0", 1000, lambda: _blob(9)))


def test_a_child_forked_during_a_download_waits_for_it_and_never_on_its_copy_of_the_lock(
    tmp_path: Path,
) -> None:
    """NOTE [ Cache locks across fork ]: a worker forked while a thread of its parent holds an
    object's download lock used to inherit that lock and wait on it forever."""
    cache = ShardCache(str(tmp_path), budget_bytes=10_000)
    entered, release = threading.Event(), threading.Event()

    def slow(file: str) -> int:
        entered.set()
        assert release.wait(timeout=60)
        with open(file, "wb") as f:
            return f.write(_blob(0))

    parent = threading.Thread(target=cache.fill, args=("s3://b/0", 1000, lambda: _blob(0), slow))
    parent.start()
    assert entered.wait(timeout=60)  # the parent's thread holds the object's lock now
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_fill_in_child, args=(str(tmp_path), results))
    child.start()
    release.set()
    parent.join(timeout=60)
    child.join(timeout=60)
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join(timeout=10)
    assert not alive, "the forked child waited on its inherited copy of the download lock"
    assert child.exitcode == 0
    assert results.get(timeout=10) is True
    with open(cache.path_for("s3://b/0"), "rb") as f:
        assert f.read() == _blob(0)  # the parent's download, not a second one by the child


_OTHER = "s3://b/other-pack/shard-0.tar"  # a download of 60 KB nobody asks for again


def _download_in_child(directory: str, parent: Any) -> None:
    """Download ``_OTHER`` into the cache, stopping half way until ``parent`` says to go on
    (never, for a child killed there)."""
    cache = ShardCache(directory, budget_bytes=100_000)

    def half_then_wait(file: str) -> int:
        with open(file, "r+b") as f:
            f.write(_blob(7, 30_000))
            f.flush()
            parent.send("half way")
            assert parent.poll(60) and parent.recv() == "go on"
            return f.write(_blob(7, 30_000)) + 30_000

    assert cache.fill(_OTHER, 60_000, lambda: _blob(7, 60_000), half_then_wait)


@pytest.mark.parametrize("killed", [True, False])
def test_a_killed_download_frees_its_reservation_and_a_live_one_keeps_it(
    tmp_path: Path, killed: bool
) -> None:
    """NOTE [ Partial files of dead downloads ]: a process killed (SIGKILL) half way through
    downloading an object nobody asks for again used to keep its 60 KB reservation of a
    100 KB budget forever: 30 KB objects filled after it evicted each other. Now the next
    recount removes that partial file and all three stay cached. A download still running in
    another process keeps its partial and its reservation, and completes."""
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_download_in_child, args=(str(tmp_path), there))
    child.start()
    there.close()
    try:
        assert here.poll(60) and here.recv() == "half way"
        if killed:
            os.kill(child.pid, signal.SIGKILL)
            child.join(timeout=60)
            assert child.exitcode == -signal.SIGKILL
        cache = ShardCache(str(tmp_path), budget_bytes=100_000)
        partial = f"{cache.path_for(_OTHER)}.60000.partial"
        assert os.path.exists(partial)
        for k in range(3):
            assert cache.fill(f"s3://b/new/{k}", 30_000, lambda k=k: _blob(k, 30_000))
        kept = [cache.cached(f"s3://b/new/{k}") for k in range(3)]
        assert os.path.exists(partial) is not killed
        assert kept == ([True] * 3 if killed else [False, False, True])
        assert cache.used_bytes_locked() == 90_000
        if not killed:
            here.send("go on")
    finally:
        here.close()  # a child still waiting for word stops at once
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    if not killed:
        assert child.exitcode == 0 and not os.path.exists(partial)
        with open(cache.path_for(_OTHER), "rb") as f:
            assert f.read() == _blob(7, 60_000)
