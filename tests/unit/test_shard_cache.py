"""ShardCache on real files: never more bytes on disk than the budget (also with threads filling
at once), least recently used first out, pinned files never evicted, one download per object."""

from __future__ import annotations

import errno
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from stoker.storage import ShardCache


def _blob(k: int, size: int = 1000) -> bytes:
    return bytes([k % 256]) * size


def _ledger(cache: ShardCache) -> int:
    """The bytes the cache's ledger says are in use (NOTE [ Shard cache ])."""
    with open(os.path.join(cache.directory, ".usage"), "rb") as f:
        return int(f.read())


def _on_disk(cache: ShardCache) -> int:
    return sum(e.stat().st_size for e in os.scandir(cache.directory) if e.is_file()
               and not e.name.startswith("."))


def test_fills_evict_the_least_recently_used_and_stay_within_budget(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), budget_bytes=3500)
    for k in range(3):
        assert cache.fill(f"s3://b/{k}", 1000, lambda k=k: _blob(k))
    os.close(cache.open_pinned("s3://b/0"))  # used again: now the most recent
    assert cache.fill("s3://b/3", 1000, lambda: _blob(3))  # evicts 1, the least recent
    assert cache.open_pinned("s3://b/1") is None
    for k in (0, 2, 3):
        fd = cache.open_pinned(f"s3://b/{k}")
        assert fd is not None and os.pread(fd, 1000, 0) == _blob(k)
        os.close(fd)
    assert _on_disk(cache) == cache.used_bytes() == 3000
    assert cache.evictions() == 1  # as every process on the directory counts it
    assert ShardCache(str(tmp_path), budget_bytes=1500).fill("s3://b/4", 1000, lambda: _blob(4))
    assert cache.evictions() == 4 and cache.cached("s3://b/4")  # 0, 2 and 3 made room
    assert not any(cache.cached(f"s3://b/{k}") for k in range(4))


def test_a_pinned_file_is_never_evicted_and_a_fill_without_room_is_refused(tmp_path) -> None:
    cache = ShardCache(str(tmp_path), budget_bytes=2000)
    pins = []
    for k in range(2):
        assert cache.fill(f"u{k}", 1000, lambda k=k: _blob(k))
        pins.append(cache.open_pinned(f"u{k}"))
    assert not cache.fill("u2", 1000, lambda: _blob(2))  # both in use: no room, not cached
    assert cache.open_pinned("u2") is None and _on_disk(cache) == 2000
    os.close(pins.pop(0))
    assert cache.fill("u2", 1000, lambda: _blob(2))  # u0 let go: evicted for u2
    assert cache.open_pinned("u0") is None
    os.close(pins.pop())
    assert not cache.fill("huge", 2001, lambda: _blob(9, 2001))  # larger than the budget


def test_an_object_of_unknown_size_is_reserved_once_downloaded(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), budget_bytes=2500)
    calls = []

    def download(k: int, size: int = 1000) -> bytes:
        calls.append(k)
        return _blob(k, size)

    assert cache.fill("u0", None, lambda: download(0)) and cache.fill("u1", None,
                                                                       lambda: download(1))
    assert cache.fill("u0", None, lambda: download(0))  # cached: not downloaded again
    assert calls == [0, 1] and _on_disk(cache) == cache.used_bytes() == 2000
    assert cache.fill("u2", None, lambda: download(2))  # evicts u0, the least recent
    assert cache.open_pinned("u0") is None and _on_disk(cache) == 2000
    assert not cache.fill("huge", None, lambda: download(9, 2501))  # larger than the budget
    assert cache.open_pinned("huge") is None and _on_disk(cache) == 2000


@pytest.mark.parametrize("streamed", [False, True])
def test_concurrent_fills_never_exceed_the_budget_and_download_each_object_once(
    tmp_path, streamed
) -> None:
    """Also when downloads stream into their reserved files: a file half written still
    counts at its reserved size."""
    cache = ShardCache(str(tmp_path), budget_bytes=5000)
    in_flight: dict[str, int] = {}
    most_at_once: dict[str, int] = {}
    lock = threading.Lock()
    over: list[int] = []
    stop = threading.Event()

    def download(url: str, k: int) -> bytes:
        with lock:
            in_flight[url] = in_flight.get(url, 0) + 1
            most_at_once[url] = max(most_at_once.get(url, 0), in_flight[url])
        data = _blob(k)
        with lock:
            in_flight[url] -= 1
        return data

    def download_into(url: str, k: int, file: str) -> int:
        data = download(url, k)
        with open(file, "wb") as f:
            for start in range(0, len(data), 250):
                f.write(data[start : start + 250])
                f.flush()
        return len(data)

    def watch() -> None:  # counts the directory between the cache's own steps
        while not stop.is_set():
            used = cache.used_bytes_locked()
            if used > 5000:
                over.append(used)

    def worker(t: int) -> None:
        for k in list(range(4)) * 2 + [4 + t, 8 + t]:  # 0..3 wanted by every thread
            url = f"s3://b/{k}"
            into = (lambda file, url=url, k=k: download_into(url, k, file)) if streamed \
                else None
            assert cache.fill(url, 1000, lambda url=url, k=k: download(url, k), into)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stop.set()
    watcher.join(timeout=60)
    assert not over, f"bytes on disk went over the budget: {over[:5]}"
    assert cache.used_bytes() <= 5000
    assert set(most_at_once) == {f"s3://b/{k}" for k in range(12)}
    assert set(most_at_once.values()) == {1}  # never two downloads of one object at once
    assert _ledger(cache) == cache.used_bytes()  # nobody died: the ledger is exact


def test_a_failed_download_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), budget_bytes=5000)

    def broken() -> bytes:
        raise ConnectionResetError("reset mid-download")

    with pytest.raises(ConnectionResetError):
        cache.fill("s3://b/x", 1000, broken)
    assert cache.used_bytes() == 0 and cache.open_pinned("s3://b/x") is None
    with pytest.raises(OSError) as info:
        cache.fill("s3://b/x", 1000, lambda: b"short")
    assert str(info.value) == "s3://b/x: downloaded 5 bytes, the object is 1000"
    assert cache.used_bytes() == 0
    assert _ledger(cache) == 0  # each failed reservation given back


def test_a_full_disk_is_a_fill_that_does_not_fit_and_lowers_the_budget(tmp_path) -> None:
    """NOTE [ A full disk under the cache ]: a download that finds the disk full leaves no
    partial file and no reservation, is reported as not cached (the reader reads by range),
    and lowers the budget to what the cache holds (one warning); later fills evict to fit."""
    from stoker.storage import RemoteReadError

    cache = ShardCache(str(tmp_path), budget_bytes=10_000)
    assert cache.fill("s3://b/0", 1000, lambda: _blob(0))

    def disk_full(file: str) -> int:  # as a write to a full disk fails, part way through
        with open(file, "r+b") as f:
            f.write(_blob(1, 500))
        raise OSError(errno.ENOSPC, "No space left on device", file)

    def as_a_read_error(file: str) -> int:  # the source's download wraps it, not retried
        try:
            disk_full(file)
        except OSError as exc:
            raise RemoteReadError("reading s3://b/2 failed: a permanent error") from exc
        return 0

    with pytest.warns(RuntimeWarning, match="is full") as warned:
        assert not cache.fill("s3://b/1", 1000, lambda: pytest.fail("streamed"), disk_full)
    assert "cache_bytes=10000" in str(warned[0].message)
    assert cache.budget_bytes == 1000 and not cache.cached("s3://b/1")
    assert _on_disk(cache) == cache.used_bytes() == _ledger(cache) == 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once a process
        assert cache.fill("s3://b/3", 1000, lambda: _blob(3))  # evicts 0 to make room
        assert cache.cached("s3://b/3") and not cache.cached("s3://b/0")
        # The disk full again, seen through the read error the source raises: evicted 3 to
        # make room, and nothing fits now.
        assert not cache.fill("s3://b/2", 1000, lambda: pytest.fail("streamed"),
                              as_a_read_error)
    assert cache.budget_bytes == 0 and _on_disk(cache) == _ledger(cache) == 0
    with pytest.raises(ConnectionResetError):  # any other failure is still raised
        ShardCache(str(tmp_path / "other"), 5000).fill(
            "s3://b/4", 500, lambda: (_ for _ in ()).throw(ConnectionResetError()))


def test_a_cache_directory_removed_under_it_is_made_again(tmp_path: Path) -> None:
    """NOTE [ A full disk under the cache ]: a cleaner removing the cache's directory mid-run
    costs the download in flight its cached copy (read by range instead: not cached, no
    error such as a missing object), and later claims and fills make it again."""
    import shutil

    cache = ShardCache(str(tmp_path / "cache"), budget_bytes=5000)
    assert cache.fill("s3://b/0", 1000, lambda: _blob(0))
    shutil.rmtree(cache.directory)
    claim = cache.claim("s3://b/1")  # its lock file's directory made again
    assert claim is not None
    assert cache.fill_claimed("s3://b/1", claim, 1000, lambda file: _write(file, _blob(1)))

    def removed_meanwhile(file: str) -> int:
        shutil.rmtree(cache.directory)
        return _write(file, _blob(2))  # as a download opens its file: gone with the directory

    assert not cache.fill("s3://b/2", 1000, lambda: pytest.fail("streamed"), removed_meanwhile)
    assert cache.fill("s3://b/2", 1000, lambda: _blob(2))
    fd = cache.open_pinned("s3://b/2")
    assert fd is not None and os.pread(fd, 1000, 0) == _blob(2)
    os.close(fd)


def _write(file: str, data: bytes) -> int:
    with open(file, "r+b") as f:
        return f.write(data)


def test_a_download_streams_into_its_reservation_and_a_dead_ones_is_cleared(
    tmp_path: Path
) -> None:
    """A download of known size writes straight into its reserved file, which counts at the
    reserved size while it fills; a reservation left by a process that died is removed by the
    next fill of that object, and one of another object in flight is left alone."""
    from stoker.storage.cache_locks import release_claim

    cache = ShardCache(str(tmp_path), budget_bytes=5000)
    dead = cache.path_for("s3://b/x") + ".1000.partial"  # a killed download's, half written
    other = cache.path_for("s3://b/y") + ".3000.partial"  # another's, in flight: its lock held
    in_flight = cache.claim("s3://b/y")
    assert in_flight is not None
    for path in (dead, other):
        with open(path, "wb") as f:
            f.write(b"x" * 100)
    assert cache.used_bytes() == 4000
    seen: list[int] = []

    def into(file: str) -> int:
        assert file.endswith(".1000.partial") and os.path.getsize(file) == 0
        seen.append(cache.used_bytes())
        with open(file, "wb") as f:
            return f.write(_blob(3))

    try:
        assert cache.fill("s3://b/x", 1000, lambda: pytest.fail("not streamed"), into)
    finally:
        release_claim(in_flight)
    assert seen == [4000]  # the dead one gone, this one counted at 1000 while empty
    assert not os.path.exists(dead) and os.path.exists(other)
    assert cache.used_bytes() == 4000 and _on_disk(cache) == 1100
    fd = cache.open_pinned("s3://b/x")
    assert fd is not None and os.pread(fd, 2000, 0) == _blob(3)
    os.close(fd)


def test_a_reservation_with_room_lists_no_directory_and_a_stale_ledger_is_recounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing the directory per download grew with the cache: with room to spare the ledger
    alone decides. Files removed behind the cache's back leave it counting more than the
    disk holds; when it then says the budget is full, one pass counts the truth."""
    cache = ShardCache(str(tmp_path), budget_bytes=5000)
    assert cache.fill("s3://b/0", 1000, lambda: _blob(0))  # no ledger yet: counted once
    listings: list[str] = []
    real_scandir = os.scandir

    def scandir(path: str) -> Any:
        listings.append(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    for k in (1, 2, 3):
        assert cache.fill(f"s3://b/{k}", 1000, lambda k=k: _blob(k))
    assert listings == [] and _ledger(cache) == 4000
    for k in (0, 1, 2):  # gone behind the cache's back: the ledger still says 4000
        os.unlink(cache.path_for(f"s3://b/{k}"))
    assert cache.fill("s3://b/4", 1000, lambda: _blob(4))  # 4000 + 1000 fits: no pass
    assert listings == [] and _ledger(cache) == 5000
    assert cache.fill("s3://b/5", 1000, lambda: _blob(5))  # "full": counted, 2000 in use
    assert listings == [cache.directory]
    assert _ledger(cache) == cache.used_bytes() == 3000
    for k in (3, 4, 5):
        fd = cache.open_pinned(f"s3://b/{k}")
        assert fd is not None and os.pread(fd, 2000, 0) == _blob(k)
        os.close(fd)


def test_the_ledger_is_written_in_place_and_one_it_cannot_read_is_recounted(
    tmp_path: Path,
) -> None:
    """The ledger is rewritten in place (no new file per download); what another version
    left there (a shorter number, one longer than ours, or bytes that are no number) is
    read when it can be and otherwise counted again from the directory."""
    cache = ShardCache(str(tmp_path), budget_bytes=10_000)
    assert cache.fill("s3://b/0", 1000, lambda: _blob(0))
    ledger = os.path.join(cache.directory, ".usage")
    inode = os.stat(ledger).st_ino
    assert cache.fill("s3://b/1", 1000, lambda: _blob(1))
    assert os.stat(ledger).st_ino == inode and _ledger(cache) == 2000
    with open(ledger, "wb") as f:  # an older version's ledger: the same count, unpadded
        f.write(b"2000")
    assert cache.fill("s3://b/2", 1000, lambda: _blob(2)) and _ledger(cache) == 3000
    with open(ledger, "wb") as f:  # longer than ours: cut to our width when written
        f.write(b"%040d" % 3000)
    assert cache.fill("s3://b/3", 1000, lambda: _blob(3)) and _ledger(cache) == 4000
    assert os.path.getsize(ledger) == 21
    with open(ledger, "wb") as f:
        f.write(b"not a number")
    assert cache.fill("s3://b/4", 1000, lambda: _blob(4))
    assert _ledger(cache) == cache.used_bytes() == 5000


def test_a_claimed_object_is_downloaded_once_by_its_claimer_while_others_wait(
    tmp_path: Path,
) -> None:
    """NOTE [ The main process fetches for its workers ]: a claim takes the object's lock
    before its download starts; a reader meanwhile waits for that download and never makes
    its own; a claim given up lets the next reader download it."""
    from stoker.storage.cache_locks import release_claim

    cache = ShardCache(str(tmp_path), budget_bytes=5000)
    claim = cache.claim("s3://b/0")
    assert claim is not None and cache.claim("s3://b/0") is None  # held: one claimer
    answers: list[bool] = []
    reader = threading.Thread(target=lambda: answers.append(
        cache.fill("s3://b/0", 1000, lambda: pytest.fail("the claimer downloads it"))))
    reader.start()

    def into(file: str) -> int:
        with open(file, "wb") as f:
            return f.write(_blob(0))

    assert cache.fill_claimed("s3://b/0", claim, 1000, into)
    reader.join(timeout=60)
    assert answers == [True] and cache.claim("s3://b/0") is None  # cached: nothing to claim
    given_up = cache.claim("s3://b/1")
    assert given_up is not None
    release_claim(given_up)
    assert cache.fill("s3://b/1", 1000, lambda: _blob(1)) and _ledger(cache) == 2000


def test_a_bad_budget_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        ShardCache(str(tmp_path), budget_bytes=0)
    assert str(info.value) == (
        "cache budget_bytes=0: must be > 0 (bytes of local disk the cache may use); pass "
        "cache_dir=None to read by range without a cache"
    )


def _reserve_as_a_dead_download(cache: ShardCache, url: str, size: int) -> str:
    """What a download of ``url`` killed mid-way leaves: its reservation file, and the ledger
    raised for it."""
    partial = f"{cache.path_for(url)}.{size}.partial"
    open(partial, "wb").close()
    with open(os.path.join(cache.directory, ".usage"), "wb") as f:
        f.write(b"%d" % size)
    return partial


@pytest.mark.parametrize("lock_file", [True, False])
def test_the_partial_file_of_a_dead_download_of_another_object_frees_its_budget(
    tmp_path: Path, lock_file: bool
) -> None:
    """NOTE [ Partial files of dead downloads ]: a partial file whose object's lock nobody
    holds (its lock file left behind, or gone) is removed by the next recount. It used to
    keep its 60 KB of a 100 KB budget forever, so only one 30 KB object fit at a time."""
    cache = ShardCache(str(tmp_path), budget_bytes=100_000)
    dead = "s3://b/old-pack/shard-0.tar"  # never asked for again
    if lock_file:
        open(os.path.join(cache.directory, ".locks", os.path.basename(cache.path_for(dead))),
             "wb").close()
    partial = _reserve_as_a_dead_download(cache, dead, 60_000)
    for k in range(3):
        assert cache.fill(f"s3://b/new/{k}", 30_000, lambda k=k: _blob(k, 30_000))
    assert not os.path.exists(partial)
    assert all(cache.cached(f"s3://b/new/{k}") for k in range(3)) and cache.evictions() == 0
    assert _on_disk(cache) == cache.used_bytes() == _ledger(cache) == 90_000


def test_the_partial_file_of_a_live_download_is_kept_and_counted(tmp_path: Path) -> None:
    """NOTE [ Partial files of dead downloads ]: a partial whose object's lock is held (a
    download in flight on another thread: another open file of the lock) is never removed by
    a recount, and keeps its bytes of the budget until that download ends."""
    cache = ShardCache(str(tmp_path), budget_bytes=100_000)
    live = "s3://b/other-pack/shard-0.tar"
    entered, release = threading.Event(), threading.Event()
    answers: list[bool] = []

    def slow(file: str) -> int:
        entered.set()
        assert release.wait(timeout=60)
        with open(file, "r+b") as f:
            return f.write(_blob(7, 60_000))

    downloading = threading.Thread(target=lambda: answers.append(cache.fill(
        live, 60_000, lambda: pytest.fail("streamed: its size is known"), slow)))
    downloading.start()
    try:
        assert entered.wait(timeout=60)
        partial = f"{cache.path_for(live)}.60000.partial"
        for k in range(3):  # each recount keeps the live partial: one 30 KB object fits
            assert cache.fill(f"s3://b/new/{k}", 30_000, lambda k=k: _blob(k, 30_000))
            assert os.path.exists(partial)
        assert [cache.cached(f"s3://b/new/{k}") for k in range(3)] == [False, False, True]
        assert cache.used_bytes() == _ledger(cache) == 90_000
    finally:
        release.set()
        downloading.join(timeout=60)
    assert answers == [True] and not os.path.exists(partial)
    with open(cache.path_for(live), "rb") as f:
        assert f.read() == _blob(7, 60_000)


def test_an_object_tagged_with_its_content_is_cached_under_its_url_and_tag(
    tmp_path: Path,
) -> None:
    """NOTE [ Cached copies named by their content ]: a copy cached for one tag is not the
    object under another (a pack written again at the same URL); an unchanged tag keeps it."""
    cache = ShardCache(str(tmp_path), 10**6)
    url = "s3://bucket/pack/shard-000000.tar"
    assert cache.fill(url, 3, lambda: b"old")
    untagged = cache.path_for(url)
    assert cache.expect_versions({url: "aa"}) == []  # untagged before: nothing it replaces
    assert not cache.cached(url)  # the untagged copy is not the tagged object
    assert cache.fill(url, 3, lambda: b"new")
    tagged = cache.path_for(url)
    assert tagged != untagged and tagged.endswith("shard-000000.tar")
    assert cache.expect_versions({url: "aa"}) == []
    assert cache.cached(url)
    assert cache.expect_versions({url: "bb", "s3://bucket/pack/other.tar": "cc"}) == [url]
    assert not cache.cached(url)
    assert cache.expect_versions({url: "aa"}) == [url]
    with open(cache.path_for(url), "rb") as f:
        assert f.read() == b"new"
