"""ShardCache locks across fork (NOTE [ Cache locks across fork ]): a real forked child, a
real download lock held by a thread of its parent."""

from __future__ import annotations

import multiprocessing as mp
import threading
from pathlib import Path
from typing import Any

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
