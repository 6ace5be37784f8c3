"""Object storage through a real S3-compatible server over HTTP (moto in server mode behind a
fault-injecting proxy, ``_s3_server``): what a remote dataset yields equals the local copy,
transient failures are retried without losing or duplicating a sample, a failure for good
names the object, resume is exact, ranks read their own shares, and the cache stays within
its budget."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import warnings
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _s3_server import SERVER_NEEDS

from _optional import skip_module_unless

skip_module_unless(
    *SERVER_NEEDS,
    ("s3fs", "reading s3:// needs s3fs (test extra)"),
)

from _remote_datasets import (  # noqa: E402
    FAST_RETRY,
    RECORD_BYTES,
    LabelAndClient,
    Records,
    epoch_samples,
    on_small_disk,
    record_indices,
    records_on_server,
)
from _s3_server import S3Server  # noqa: E402
from test_distributed import (  # noqa: E402
    LAUNCH_CAP_S,
    LAUNCHER_SLACK_S,
    _free_port,
    mark,
    run_ranks,
)
from test_tar_stream import Numbers, label  # noqa: E402

import stoker  # noqa: E402
from stoker.errors import ShardError  # noqa: E402
from stoker.storage import LocalSource, RemoteReadError, open_source  # noqa: E402
from stoker.testing import assert_resumes_exactly  # noqa: E402

SHARDS, PER_SHARD, BATCH = 6, 20, 8
N = SHARDS * PER_SHARD


@pytest.fixture
def s3(tmp_path: Path):
    with records_on_server(tmp_path, SHARDS, PER_SHARD) as server:
        yield server


def _remote(s3: S3Server, tmp_path: Path, **options: Any) -> Records:
    source = open_source(s3.urls[0], storage_options=s3.storage_options, retry=FAST_RETRY,
                         **options)
    return Records(source, s3.urls, PER_SHARD)


def _epoch(dataset: Records, **kwargs: Any) -> list[list[int]]:
    timeout = 60 if kwargs.get("num_workers") else 0
    loader = stoker.DataLoader(dataset, batch_size=BATCH, timeout=timeout, **kwargs)
    return [batch[:, 0].tolist() + batch[:, 1].tolist() for batch in loader]


@pytest.mark.parametrize("fetch", ["range", "shard"])
def test_remote_dataset_yields_what_the_local_files_do(s3, tmp_path, fetch) -> None:
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 10**6} if fetch == "shard" else {}
    remote = _remote(s3, tmp_path, fetch=fetch, **cache)
    local = Records(LocalSource(), s3.local_urls, PER_SHARD)
    kwargs = {"shuffle": True, "num_workers": 2}
    got = _epoch(remote, generator=torch.Generator().manual_seed(3), **kwargs)
    want = _epoch(local, generator=torch.Generator().manual_seed(3), **kwargs)
    assert got == want
    assert record_indices(got) == Counter(range(N))
    gets = {p: n for p, n in s3.faults.gets_by_path.items() if p.startswith("/bucket/data/")}
    if fetch == "shard":  # one GET per shard: the workers shared the node's cache
        assert gets == {f"/bucket/data/shard-{s:04d}.bin": 1 for s in range(SHARDS)}
    else:  # one GET per sample
        assert sum(gets.values()) == N


@pytest.mark.parametrize("fetch", ["range", "shard"])
def test_transient_failures_are_retried_without_losing_or_repeating_a_sample(
    s3, tmp_path, fetch
) -> None:
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 10**6} if fetch == "shard" else {}
    remote = _remote(s3, tmp_path, fetch=fetch, **cache)
    for s, kind in enumerate(["status", "reset", "truncate", "status", "reset", "truncate"]):
        s3.faults.fail(kind, f"shard-{s:04d}", times=2)
    s3.faults.fail("status", "shard-0001", times=1, status=500)
    got = _epoch(remote, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(1))
    assert s3.faults.injected == 13
    assert record_indices(got) == Counter(range(N))  # each sample exactly once
    want = _epoch(Records(LocalSource(), s3.local_urls, PER_SHARD), shuffle=True,
                  generator=torch.Generator().manual_seed(1))
    assert got == want  # and with its own bytes


def test_a_read_that_keeps_failing_names_the_object(s3, tmp_path) -> None:
    remote = _remote(s3, tmp_path, fetch="range")
    s3.faults.fail("status", "shard-0002", times=-1, status=503)
    loader = stoker.DataLoader(remote, batch_size=BATCH, num_workers=2, timeout=60)
    with pytest.raises(RemoteReadError) as info:
        list(loader)
    error = info.value
    assert (error.url, error.attempts, error.length) == (s3.urls[2], 5, RECORD_BYTES)
    assert error.offset in range(0, PER_SHARD * RECORD_BYTES, RECORD_BYTES)
    assert str(error) == (
        f"reading {s3.urls[2]} (bytes {error.offset}..{error.offset + RECORD_BYTES}) failed "
        "after 5 attempt(s), the last error: OSError: [Errno 5] An error occurred "
        "(InjectedFault) when calling the GetObject operation (reached max retries: 0): "
        "injected 503 (a store failing this long is down or overloaded: check it, or allow "
        "more tries with RetryPolicy(attempts=...))"
    )


def test_a_missing_object_is_not_retried_and_says_so(s3, tmp_path) -> None:
    # s3fs's message (obstore's: test_remote_obstore)
    source = open_source("s3://bucket/data/nope.bin", storage_options=s3.storage_options,
                         retry=FAST_RETRY, client="fsspec")
    try:
        with pytest.raises(FileNotFoundError) as info:
            source.read_range("s3://bucket/data/nope.bin", 0, 10)
        assert str(info.value) == (
            "s3://bucket/data/nope.bin: no such object (FileNotFoundError: The specified key "
            "does not exist.)"
        )
        assert s3.faults.gets_by_path == {"/bucket/data/nope.bin": 1}
    finally:
        source.close()  # type: ignore[attr-defined]


def test_resume_is_exact_from_the_server(s3, tmp_path) -> None:
    remote = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "c"),
                     cache_bytes=10**6)

    def make_loader() -> stoker.DataLoader:
        return stoker.DataLoader(remote, batch_size=BATCH, shuffle=True, num_workers=2,
                                 generator=torch.Generator().manual_seed(5), timeout=60)

    check = assert_resumes_exactly(make_loader, epochs=1, steps=[1, 7, 14])
    assert check is not None


def test_cache_stays_within_its_budget_and_evicts(s3, tmp_path) -> None:
    shard_bytes = PER_SHARD * RECORD_BYTES
    budget = int(2.5 * shard_bytes)  # room for two shards
    remote = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "c"),
                     cache_bytes=budget, lookahead_shards=0)
    cache = remote.source.cache  # type: ignore[attr-defined]
    sizes = []
    for i in range(N):  # sequential: each shard read whole, the oldest evicted
        assert remote[i][0].item() == i
        sizes.append(cache.used_bytes())
    remote.source.close()  # type: ignore[attr-defined]
    assert max(sizes) <= budget
    assert max(sizes) == 2 * shard_bytes
    cached = sorted(n.split("-", 1)[1] for n in os.listdir(cache.directory) if n[0] != ".")
    assert cached == ["shard-0004.bin", "shard-0005.bin"]
    gets = {p: n for p, n in s3.faults.gets_by_path.items() if p.startswith("/bucket/data/")}
    assert gets == {f"/bucket/data/shard-{s:04d}.bin": 1 for s in range(SHARDS)}


@pytest.mark.parametrize("room", ["ample", "tight"])
def test_shuffled_reads_open_each_cached_shard_once_when_the_budget_has_room(
    s3, tmp_path, room
) -> None:
    """NOTE [ Shard prefetch order ]: with room in the budget, a process keeps the cached
    shards it reads open (pinned), so a shuffled pass opens each one once instead of once per
    sample; with a budget of a few shards it pins only lookahead_shards + 1 of them, so the
    others stay evictable, and every sample is still right."""
    shard_bytes = PER_SHARD * RECORD_BYTES
    budget = 10**9 if room == "ample" else 3 * shard_bytes
    remote = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "c"),
                     cache_bytes=budget, lookahead_shards=1)
    source = remote.source
    opened: list[str] = []  # cached files opened (a miss before a download is not one)
    real_open = source.cache.open_pinned  # type: ignore[attr-defined]

    def counted(url: str) -> int | None:
        fd = real_open(url)
        if fd is not None:
            opened.append(url)
        return fd

    source.cache.open_pinned = counted  # type: ignore[attr-defined]
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    for _ in range(2):
        assert [remote[i][0].item() for i in order] == order
    pinned = len(source._prefetcher._pins)  # type: ignore[attr-defined]
    source.close()  # type: ignore[attr-defined]
    if room == "ample":
        assert sorted(opened) == sorted(s3.urls) and pinned == SHARDS
    else:
        assert len(opened) > 2 * N * 0.5 and pinned == 2


def test_plan_fetches_the_next_shards_ahead(s3, tmp_path) -> None:
    remote = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "c"),
                     cache_bytes=10**6, lookahead_shards=2)
    remote.source.plan(s3.urls)  # type: ignore[attr-defined]
    assert remote[0][0].item() == 0
    remote.source._prefetcher.close()  # waits for the downloads in flight  # type: ignore
    cache = remote.source.cache  # type: ignore[attr-defined]
    cached = sorted(n.split("-", 1)[1] for n in os.listdir(cache.directory) if n[0] != ".")
    assert cached == ["shard-0000.bin", "shard-0001.bin", "shard-0002.bin"]
    remote.source.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("streamed", [False, True])
def test_objects_of_known_size_stream_to_disk_and_one_of_another_size_is_named(
    s3, tmp_path, monkeypatch, streamed
) -> None:
    """A whole object of known size goes to the cache through one GET straight to its file
    (streamed when large); one whose size is not what the manifest said, shorter or longer,
    fails at once (no retries: it is another object), naming it, and is not cached."""
    from stoker.storage import remote_requests

    if streamed:  # every object is "large": fsspec's streamed get
        monkeypatch.setattr(remote_requests, "_READ_WHOLE_MAX", 0)
    source = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "c"),
                     cache_bytes=10**6).source
    sizes = [Path(p).stat().st_size for p in s3.local_urls]
    source.expect_sizes({s3.urls[0]: sizes[0], s3.urls[1]: sizes[1] + 1})  # type: ignore
    source.get_whole = lambda path: pytest.fail("read into memory")  # type: ignore
    gets = s3.faults.gets
    assert source.read(s3.urls[0]) == Path(s3.local_urls[0]).read_bytes()
    assert s3.faults.gets == gets + 1
    with pytest.raises(RemoteReadError) as info:
        source.read(s3.urls[1])
    assert info.value.attempts == 1 and s3.faults.gets == gets + 2
    assert str(info.value) == (
        f"reading {s3.urls[1]} (bytes 0..{sizes[1] + 1}) failed after a permanent error, not "
        f"retried: ValueError: the object is {sizes[1]} bytes, its listing or the dataset's "
        f"manifest says {sizes[1] + 1}: it changed since. If the pack was written again "
        "since the dataset was opened, open the dataset again; else index it again (stoker "
        "pack)")
    assert source.local_path(s3.urls[1]) is None  # type: ignore[attr-defined]
    assert source.cache.used_bytes() == sizes[0]  # type: ignore[attr-defined]
    source.expect_sizes({s3.urls[2]: sizes[2] - 1})  # type: ignore[attr-defined]
    with pytest.raises(RemoteReadError) as info:
        source.read(s3.urls[2])
    assert info.value.attempts == 1 and str(info.value).endswith(
        f"ValueError: the object is {sizes[2] if streamed else f'over {sizes[2] - 1}'} "
        "bytes, its listing or the dataset's "
        f"manifest says {sizes[2] - 1}: it changed since. If the pack was written again "
        "since the dataset was opened, open the dataset again; else index it again (stoker "
        "pack)")
    assert source.local_path(s3.urls[2]) is None  # type: ignore[attr-defined]
    source.close()  # type: ignore[attr-defined]


def _in_forked_child(target: Any, *args: Any) -> Any:
    """Run ``target(*args, conn)`` in a forked child and return what it sent on ``conn``."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=target, args=(*args, theirs))
    child.start()
    try:
        assert ours.poll(30), f"{target.__name__} in the child did not finish"
        answer = ours.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    assert child.exitcode == 0
    return answer


def _prefetch_in_child(source: Any, url: str, conn: Any) -> None:
    source.prefetch([url])
    # Its threads run the download (close() would cancel it if it had not started yet).
    source._prefetcher._executor.shutdown(wait=True)
    conn.send(source.local_path(url) is not None)
    source._prefetcher.close()


def test_a_forked_child_prefetches_with_threads_of_its_own(s3, tmp_path) -> None:
    """A child forked after its parent started download threads gets threads of its own
    (the parent's do not run in it): what it schedules is downloaded."""
    remote = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "c"),
                     cache_bytes=10**6)
    source = remote.source
    source.prefetch([s3.urls[0]])  # type: ignore[attr-defined]
    assert _in_forked_child(_prefetch_in_child, source, s3.urls[1]) is True
    source.close()  # type: ignore[attr-defined]
    assert source.local_path(s3.urls[0]) is not None  # type: ignore[attr-defined]


def test_s3_sources_dropped_without_close_stop_their_loop_threads(s3, tmp_path, caplog) -> None:
    """NOTE [ A source dropped without close ] (s3fs): collecting a source closes its S3 client on
    its own loop and stops the loop thread; nothing is logged (no session closed on another
    source's loop, no task destroyed pending)."""
    threads = []
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):
            source = _remote(s3, tmp_path, fetch="range", client="fsspec").source
            assert source.read_range(s3.urls[0], 0, 8) == (0).to_bytes(8, "little")
            threads.append(source._handle.thread)  # type: ignore[attr-defined]
            del source
        gc.collect()
        for thread in threads:
            thread.join(timeout=10)
        gc.collect()
    assert not any(thread.is_alive() for thread in threads)
    assert [r.getMessage() for r in caplog.records] == []


def test_shard_sources_dropped_without_close_close_their_pinned_files(s3, tmp_path) -> None:
    def cached_files_open() -> int:
        cache = str(tmp_path / "cache") + os.sep
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:  # another thread (the server's) may close it meanwhile
                count += os.readlink(f"/proc/self/fd/{fd}").startswith(cache)
            except FileNotFoundError:
                continue
        return count

    for _ in range(3):
        source = _remote(s3, tmp_path, fetch="shard", cache_dir=str(tmp_path / "cache"),
                         cache_bytes=10**6).source
        for url in s3.urls:  # each shard cached, the last ones pinned by this process
            assert source.read_range(url, 0, 8) is not None
        assert cached_files_open() > 0  # pinned (a few: the lookahead)
        del source
        gc.collect()
        assert cached_files_open() == 0


def _release_in_child(source: Any, conn: Any) -> None:
    source._handle.release()  # what collecting the child's copy of the source runs
    conn.send(True)


def test_a_forked_child_dropping_its_copy_leaves_the_parents_loop_running(s3, tmp_path) -> None:
    source: Any = _remote(s3, tmp_path, fetch="range", client="fsspec").source
    first = source.get_whole(s3.urls[0])
    assert _in_forked_child(_release_in_child, source) is True
    try:
        assert source._handle.thread.is_alive()
        assert source.get_whole(s3.urls[1]) == Path(s3.local_urls[1]).read_bytes()
    finally:
        source.close()
    assert first == Path(s3.local_urls[0]).read_bytes()


def _read_in_child(source: Any, url: str, conn: Any) -> None:
    import botocore.loaders

    parsed: list[str] = []
    real = botocore.loaders.JSONFileLoader.load_file

    def counted(self: Any, file_path: str) -> Any:
        parsed.append(file_path)
        return real(self, file_path)

    botocore.loaders.JSONFileLoader.load_file = counted  # type: ignore[method-assign]
    conn.send((source.get_whole(url), parsed))


def test_a_forked_child_creates_its_s3_client_from_the_parents_parsed_models(
    s3, tmp_path
) -> None:
    """NOTE [ S3 clients after fork ]: a worker's S3 client reuses the service models its
    parent parsed (no JSON file is read again), and reads the same bytes."""
    source = _remote(s3, tmp_path, fetch="range", client="fsspec").source
    first = source.get_whole(s3.urls[0])  # type: ignore[attr-defined]
    data, parsed = _in_forked_child(_read_in_child, source, s3.urls[1])
    source.close()  # type: ignore[attr-defined]
    assert data == Path(s3.local_urls[1]).read_bytes() and len(first) > 0
    assert parsed == []


@pytest.mark.parametrize("given", ["shard list", "pack"])
def test_a_streamed_tar_dataset_reads_each_shard_once_through_the_cache(
    s3, tmp_path, given
) -> None:
    """TarShardStream from the server: each worker plans its own shards, so the next ones
    download while it reads; every shard is fetched whole once into the cache, a second epoch
    reads none again, each epoch yields each sample once, and no size is asked per shard.
    Given the pack, its manifest and file of indexes are read once, when the stream is built."""
    from stoker.formats import TarShards, TarShardStream, pack

    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    names = [Path(s.path).name for s in TarShards(str(packed)).shards]
    s3.upload_dir(str(packed), "bucket", "tars")
    urls = [f"s3://bucket/tars/{n}" for n in names]
    heads = s3.faults.heads
    source = open_source(urls[0], storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7, fetch="shard")
    stream = TarShardStream(urls if given == "shard list" else "s3://bucket/tars/index.json",
                            source=source, transform=label, shuffle_buffer=5, seed=2)
    assert stream.shards == urls
    source.close()  # type: ignore[attr-defined]  # the pack's connection: reopened on use
    loader = stoker.DataLoader(stream, batch_size=3, num_workers=2, timeout=60)
    expected = {f"/bucket/tars/{n}": 1 for n in names}
    if given == "pack":
        expected |= {"/bucket/tars/index.json": 1, "/bucket/tars/index.tables.npz": 1}
    try:
        for epoch in range(2):  # the second from the cache alone
            stream.set_epoch(epoch)
            got = [x for batch in loader for x in batch.tolist()]
            assert sorted(got) == list(range(29))
            gets = {p: n for p, n in s3.faults.gets_by_path.items()
                    if p.startswith("/bucket/tars/")}
            assert gets == expected
    finally:  # over a pack the main process downloaded the shards: its connection
        source.close()  # type: ignore[attr-defined]
    assert s3.faults.heads == heads  # sizes from one listing when the stream was built


@pytest.mark.parametrize("indexes", ["one file", "sidecars at open", "per batch"])
def test_remote_tar_shards_equal_the_local_ones_with_each_shard_fetched_once(
    s3, tmp_path, monkeypatch, indexes
) -> None:
    """TarShards from the server (NOTE [ A batch's shards at once ]): every index from the
    pack's one file of indexes, or each shard's sidecar read when the dataset is built, or
    (over _EAGER_REMOTE_INDEXES shards) each batch's missing ones side by side; either way the
    shuffled epoch through 2 workers equals the local one, each shard and each index is
    fetched from the server exactly once, and no object's size is asked (the manifest's)."""
    from stoker.formats import TarShards, pack, tar_shards

    if indexes != "one file":
        monkeypatch.setattr(tar_shards, "_EAGER_TABLES_BYTES", -1)
    if indexes == "per batch":
        monkeypatch.setattr(tar_shards, "_EAGER_REMOTE_INDEXES", 0)
    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(packed), "bucket", "tars")
    heads = s3.faults.heads
    url = "s3://bucket/tars/index.json"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7, fetch="shard")
    remote = TarShards(url, source=source, transform=label)
    local = TarShards(str(packed / "index.json"), transform=label)

    def epoch(dataset: Any) -> list[int]:
        loader = stoker.DataLoader(dataset, batch_size=5, shuffle=True, num_workers=2,
                                   timeout=60, generator=torch.Generator().manual_seed(4))
        return [x for batch in loader for x in batch.tolist()]

    try:
        got = epoch(remote)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert got == epoch(local) and sorted(got) == list(range(29))
    assert s3.faults.heads == heads  # sizes from the manifest, inherited by the workers
    gets = Counter(p for p, n in s3.faults.gets_by_path.items() if p.startswith("/bucket/tars/")
                   for _ in range(n))
    shards = [Path(s.path).name for s in local.shards]
    # The file of indexes is asked for alongside the manifest whether it is used or not
    # (NOTE [ The file of indexes alongside the manifest ]).
    expected = {f"/bucket/tars/{n}" for n in shards} | {"/bucket/tars/index.json",
                                                         "/bucket/tars/index.tables.npz"}
    assert {p for p in gets if not p.endswith(".idx.npz")} == expected
    assert all(gets[p] == 1 for p in expected)
    idx = {p: n for p, n in gets.items() if p.endswith(".idx.npz")}
    if indexes == "one file":
        assert not idx
    else:  # per batch, each worker reads the indexes it needs itself
        per_batch = indexes == "per batch"
        assert len(idx) == len(shards) and all(n <= (2 if per_batch else 1) for n in idx.values())


@pytest.mark.parametrize("failing", [False, True, "opted out"])
def test_the_main_process_downloads_the_shards_its_workers_wait_for(
    s3, tmp_path, failing
) -> None:
    """NOTE [ The main process fetches for its workers ]: shuffled TarShards in shard mode
    through 2 workers: each batch's shards are downloaded once, by the loader's main process,
    and no worker makes an S3 client of its own. When the main process's download of a shard
    fails for good (503 on each of its 5 tries), the worker that waits for it downloads it
    itself: the epoch is the local one either way. With ``main_downloads=False`` each worker
    downloads its own, as before."""
    from stoker.formats import TarShards, pack

    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(packed), "bucket", "tars")
    url = "s3://bucket/tars/index.json"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7, fetch="shard",
                         main_downloads=failing != "opted out")
    remote = TarShards(url, source=source, transform=LabelAndClient(source))
    local = TarShards(str(packed / "index.json"), transform=label)
    assert source.connected  # type: ignore[attr-defined]  # the manifest, read here
    if failing is True:
        s3.faults.fail("status", "shard-000003.tar", times=FAST_RETRY.attempts)

    def epoch(dataset: Any) -> list[Any]:
        return epoch_samples(stoker.DataLoader(
            dataset, batch_size=5, shuffle=True, num_workers=2, timeout=60,
            generator=torch.Generator().manual_seed(4)))

    try:
        got = epoch(remote)
        # Whether the main process started its download threads (before close() stops them).
        main_fetched = source._prefetcher._fetchers is not None  # type: ignore[attr-defined]
    finally:
        source.close()  # type: ignore[attr-defined]
    labels = [int(x) for x, _ in got]
    assert labels == epoch(local) and sorted(labels) == list(range(29))
    shards = {f"/bucket/tars/{Path(s.path).name}" for s in local.shards}
    gets = {p: n for p, n in s3.faults.gets_by_path.items() if p in shards}
    faulty = "/bucket/tars/shard-000003.tar"
    assert set(gets) == shards
    assert all(n == 1 for p, n in gets.items() if p != faulty)
    assert main_fetched == (failing != "opted out")
    if failing == "opted out":
        # The workers downloaded them all. Not necessarily both: one may find every shard of
        # its batches cached (or in download) by the other, and never open a client.
        assert gets[faulty] == 1 and any(c for _, c in got)
    elif failing:
        assert s3.faults.injected == FAST_RETRY.attempts
        assert gets[faulty] == FAST_RETRY.attempts + 1  # the main's 5 tries, a worker's one
        clients = {int(x): c for x, c in got}
        assert any(clients.values())  # the worker that needed it made its own client
    else:
        assert gets[faulty] == 1
        assert not any(c for _, c in got)  # no worker opened a client


@pytest.mark.parametrize("large", [False, True])
def test_the_main_process_downloads_the_shards_of_a_stream_ahead_of_its_workers(
    s3, tmp_path, monkeypatch, large
) -> None:
    """NOTE [ The main process fetches for its workers ], iterable: a stream over a remote
    pack through 2 workers, each told how many samples were asked of it; the main process
    keeps ahead of where each worker can have read (its buffer's policy), so no worker makes
    an S3 client, each shard is downloaded once, and the stream is the local one's. With
    shards read as they arrive and large enough to need none fetched ahead (NOTE [ A stream
    of pieces ]), the workers fetch none ahead either: they made their own clients for that."""
    from stoker.formats import TarShards, TarShardStream, pack, tar_stream

    if large:  # the forked workers see it too
        monkeypatch.setattr(tar_stream, "_LARGE_SHARD", 1)
    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(packed), "bucket", "tars")
    source = open_source("s3://bucket/tars/index.json", storage_options=s3.storage_options,
                         retry=FAST_RETRY, cache_dir=str(tmp_path / "cache"),
                         cache_bytes=10**7, fetch="shard")
    options = {"shuffle_buffer": 5, "shuffle_initial": 2, "seed": 2}
    remote = TarShardStream("s3://bucket/tars/index.json", source=source,
                            transform=LabelAndClient(source), **options)
    local = TarShardStream(str(packed), transform=label, **options)

    def epoch(dataset: Any) -> list[Any]:
        return epoch_samples(stoker.DataLoader(dataset, batch_size=3, num_workers=2,
                                               timeout=60))

    try:
        got = epoch(remote)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert [int(x) for x, _ in got] == epoch(local)
    assert not any(c for _, c in got)  # no worker opened a client
    shards = {f"/bucket/tars/{Path(s.path).name}" for s in TarShards(str(packed)).shards}
    assert {p: n for p, n in s3.faults.gets_by_path.items() if p in shards} == dict.fromkeys(
        shards, 1)


@pytest.mark.parametrize("guessed", ["whole", "too short"])
def test_a_remote_pack_reads_its_file_of_indexes_alongside_its_manifest(
    s3, tmp_path, monkeypatch, guessed
) -> None:
    """NOTE [ The file of indexes alongside the manifest ]: its bytes, asked for with the
    manifest, are used when they are the whole file the manifest names (one GET of each);
    when the file is larger than what was asked, it is read again, whole, and the dataset is
    the same."""
    from stoker.formats import TarShards, pack, tar_manifest

    if guessed == "too short":
        monkeypatch.setattr(tar_manifest, "_GUESSED_TABLES_BYTES", 100)
    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(packed), "bucket", "tars")
    source = open_source("s3://bucket/tars/index.json", storage_options=s3.storage_options,
                         retry=FAST_RETRY)
    try:
        remote = TarShards("s3://bucket/tars/index.json", source=source, transform=label)
        assert [remote[i] for i in range(len(remote))] == list(range(29))
    finally:
        source.close()  # type: ignore[attr-defined]
    gets = s3.faults.gets_by_path
    assert gets["/bucket/tars/index.json"] == 1
    assert gets["/bucket/tars/index.tables.npz"] == (1 if guessed == "whole" else 2)


def test_a_shard_changed_after_packing_is_named_when_it_is_downloaded(s3, tmp_path) -> None:
    """In shard mode the manifest's sizes are taken without asking the store; a shard that
    is not the size the manifest says fails on its download, at once, naming the shard."""
    from stoker.formats import ShardError, TarShards, pack

    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    shard = sorted(packed.glob("*.tar"))[1]
    shard.write_bytes(shard.read_bytes()[:-512])
    s3.upload_dir(str(packed), "bucket", "changed")
    url = "s3://bucket/changed/index.json"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7, fetch="shard")
    try:
        remote = TarShards(url, source=source, transform=label)
        assert [remote[i] for i in range(4)] == [0, 1, 2, 3]  # shard 0 is whole
        with pytest.raises(ShardError) as info:
            remote[4]
    finally:
        source.close()  # type: ignore[attr-defined]
    message = str(info.value)
    assert message.startswith(f"s3://bucket/changed/{shard.name}: sample 4 ")
    assert "failed after a permanent error, not retried" in message
    assert ("it changed since. If the pack was written again since the dataset was opened, "
            "open the dataset again; else index it again (stoker pack)") in message


def _labels_from_cache(s3: S3Server, url: str, cache_dir: Path, dataset: Any,
                       cache_bytes: int = 10**7, piece_bytes: int | None = 1 << 20,
                       **loader: Any) -> list[int]:
    """One epoch through 2 workers of ``dataset(source)``, over a source of whole shards
    (or pieces of ``piece_bytes``) cached in ``cache_dir``: its labels, sorted."""
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(cache_dir), cache_bytes=cache_bytes, fetch="shard",
                         piece_bytes=piece_bytes)
    try:
        batches = stoker.DataLoader(dataset(source), batch_size=5, num_workers=2, timeout=60,
                                    **loader)
        return sorted(x for batch in batches for x in batch.tolist())
    finally:
        source.close()  # type: ignore[attr-defined]


def test_a_pack_in_a_warm_cache_is_opened_without_asking_the_shards_sizes(s3, tmp_path) -> None:
    """A second dataset over a cache the first filled reads every shard from disk and asks
    the store only for its manifest and file of indexes: no size request per shard (a
    warm cache was once taken for a local pack, and each shard's size asked in turn)."""
    from stoker.formats import TarShards, pack

    pack(Numbers(), str(tmp_path / "packed"), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(tmp_path / "packed"), "bucket", "warm")
    url = "s3://bucket/warm/index.json"

    def epoch() -> list[int]:
        return _labels_from_cache(s3, url, tmp_path / "cache",
                                  lambda source: TarShards(url, source=source, transform=label),
                                  shuffle=True)

    assert epoch() == list(range(29))
    heads, gets = s3.faults.heads, dict(s3.faults.gets_by_path)
    assert epoch() == list(range(29))
    assert s3.faults.heads == heads
    again = {p: n - gets.get(p, 0) for p, n in s3.faults.gets_by_path.items()
             if n != gets.get(p, 0)}
    # The manifest and the file of indexes, side by side (never from the cache: NOTE [ A
    # pack written again at the same place ]); no shard.
    assert again == {"/bucket/warm/index.json": 1, "/bucket/warm/index.tables.npz": 1}


def test_the_main_process_fetches_a_shard_again_once_it_was_evicted(s3, tmp_path) -> None:
    """The main process remembers the shards it saw cached and asks the disk no more about
    them (NOTE [ The main process fetches for its workers ]) only while the cache evicts
    nothing: once another process's fill evicted one, asking for it claims and downloads it
    again, so a worker never finds it missing and downloads it itself."""
    from stoker.storage import ShardCache

    first, *others = s3.urls[:3]
    sizes = {url: os.path.getsize(local) for url, local in zip(s3.urls, s3.local_urls, strict=True)}
    size = sizes[first]
    assert all(n == size for n in sizes.values())
    budget = size * 5 // 2  # room for two
    source = open_source(first, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=budget, fetch="shard")
    elsewhere = ShardCache(str(tmp_path / "cache"), budget)  # another process's view

    def downloaded_by_the_source(url: str) -> bool:  # waits for the source's download
        return elsewhere.fill(url, size, lambda: pytest.fail(f"{url} was not claimed"))

    def gets(url: str) -> int:
        return s3.faults.gets_by_path.get("/" + url.split("://", 1)[1], 0)

    try:
        source.expect_sizes(sizes)  # type: ignore[attr-defined]
        source.fetch_for_workers([first])  # type: ignore[attr-defined]
        assert downloaded_by_the_source(first) and gets(first) == 1
        source.fetch_for_workers([first])  # type: ignore[attr-defined]  # known cached
        for url in others:  # the least recently used, `first`, makes room for the second
            assert elsewhere.fill(url, size, lambda url=url: source.get_whole(url))
        assert elsewhere.evictions() == 1 and not elsewhere.cached(first)
        source.fetch_for_workers([first])  # type: ignore[attr-defined]
        assert downloaded_by_the_source(first) and gets(first) == 2
    finally:
        source.close()  # type: ignore[attr-defined]


@pytest.fixture
def small_disk(tmp_path: Path):
    """32 KiB of real disk: a cache of 10 MB runs out of it after two shards of this pack."""
    with on_small_disk(tmp_path / "small-disk") as where:
        yield where


@pytest.mark.filterwarnings("ignore:stoker. the disk under the shard cache")
def test_a_cache_on_a_full_disk_reads_the_rest_by_range_with_every_sample(
    s3, tmp_path, small_disk
) -> None:
    """NOTE [ A full disk under the cache ]: a cache_bytes larger than the disk holds is not
    an error: each download that finds the disk full is read by range instead, and a
    shuffled epoch through 2 workers, and the stream over the pack, have every sample once
    (they failed with "No space left on device")."""
    from stoker.formats import TarShards, TarShardStream, pack

    pack(Numbers(), str(tmp_path / "packed"), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(tmp_path / "packed"), "bucket", "full")
    url = "s3://bucket/full/index.json"
    cache = small_disk / "cache"
    for dataset, shuffle in (
            (lambda source: TarShards(url, source=source, transform=label), True),
            (lambda source: TarShardStream(url, source=source, transform=label,
                                           shuffle_buffer=5), False)):
        assert _labels_from_cache(s3, url, cache, dataset, shuffle=shuffle) == list(range(29))
        assert not [n for n in os.listdir(cache) if n.endswith(".partial")]
        shutil.rmtree(cache)


class _From(torch.utils.data.Dataset):
    """Numbers from ``base``: a pack of other content, or of another shape."""

    def __init__(self, base: int, n: int) -> None:
        self.base, self.n = base, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, int]:
        return {"cls": self.base + i}


@pytest.mark.parametrize("verify_crc", [True, False])
@pytest.mark.parametrize("reader", ["TarShards", "TarShards by pieces", "TarShardStream"])
def test_a_pack_written_again_at_the_same_place_is_read_new_through_a_warm_cache(
    s3, tmp_path, reader, verify_crc
) -> None:
    """NOTE [ A pack written again at the same place ]: `stoker pack` writes a new pack where
    the old one was (same shard sizes, other bytes; then another shape), and the next run
    keeps its cache: every sample is the new pack's, through 2 workers (before: CRC errors
    telling the user to pack again; with verify_crc=False, the old pack's samples: NOTE
    [ Cached copies named by their content ]), also from pieces of shards (NOTE [ Pieces
    of large objects ]). A shard wrong in the store itself still raises when CRCs are
    checked."""
    from stoker.formats import TarShards, TarShardStream, pack

    url = "s3://bucket/again/index.json"

    def epoch() -> list[int]:
        kind = TarShardStream if reader == "TarShardStream" else TarShards
        return _labels_from_cache(
            s3, url, tmp_path / "cache",
            lambda source: kind(url, source=source, transform=label, verify_crc=verify_crc),
            piece_bytes=512 if reader == "TarShards by pieces" else 1 << 20)

    def publish(version: int, base: int, n: int, per_shard: int) -> Path:
        local = tmp_path / f"pack-{version}"
        pack(_From(base, n), str(local), samples_per_shard=per_shard, workers=1,
             progress=False)
        client = s3.client()
        for old in client.list_objects_v2(Bucket="bucket", Prefix="again/").get("Contents", []):
            client.delete_object(Bucket="bucket", Key=old["Key"])
        s3.upload_dir(str(local), "bucket", "again")
        return local

    sizes = []
    for version, (base, n, per_shard) in enumerate([(0, 29, 4), (1000, 29, 4), (5000, 31, 5)]):
        local = publish(version, base, n, per_shard)
        sizes.append(sorted(p.stat().st_size for p in local.glob("*.tar")))
        assert epoch() == list(range(base, base + n))
    assert sizes[0] == sizes[1]  # the same shard sizes: only the bytes tell the packs apart
    gets = s3.faults.gets
    assert epoch() == list(range(5000, 5031))  # an unchanged pack keeps its cached copies
    assert s3.faults.gets - gets == 2  # its manifest and its file of indexes, no shard
    if not verify_crc:
        return
    local = publish(3, 7000, 29, 4)
    shard = local / "shard-000002.tar"
    data = bytearray(shard.read_bytes())
    data[512] ^= 0xFF  # the first member's first byte: its CRC no longer the index's
    s3.client().put_object(Bucket="bucket", Key="again/shard-000002.tar", Body=bytes(data))
    with pytest.raises(ShardError, match="CRC-32"):
        epoch()


def test_a_store_that_refuses_listings_is_read_with_a_size_request_per_shard(
    s3, tmp_path
) -> None:
    """Sizes come from one listing when the store lists; a bucket that grants reads but not
    listings (403 on ListObjects) costs a size request per shard instead, nothing else."""
    from stoker.formats import TarShards, pack

    pack(Numbers(), str(tmp_path / "packed"), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(tmp_path / "packed"), "bucket", "nolist")
    s3.faults.fail("status", "list-type", times=-1, status=403)
    heads = s3.faults.heads
    url = "s3://bucket/nolist/index.json"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY)
    try:
        remote = TarShards(url, source=source, transform=label)
        assert [remote[i] for i in range(len(remote))] == list(range(29))
    finally:
        source.close()  # type: ignore[attr-defined]
        s3.faults.clear()
    assert s3.faults.heads - heads == len(remote.shards)


# -- two gloo ranks x two workers, straight from the server --------------------------------

WORLD = 2


def _rank_main(rank: int, port: int, out_dir: str, options: dict[str, Any], urls: list[str],
               cache_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30),
                            init_method=f"tcp://127.0.0.1:{port}")
    try:
        source = open_source(urls[0], storage_options=options, retry=FAST_RETRY,
                             cache_dir=os.path.join(cache_dir, f"node{rank}"), cache_bytes=10**6)
        loader = stoker.DataLoader(Records(source, urls, PER_SHARD), batch_size=BATCH,
                                   shuffle=True, shard=True, shard_even="exact", num_workers=2,
                                   generator=torch.Generator().manual_seed(2), timeout=30)
        read = []
        for batch in loader:
            if not isinstance(batch, stoker.EndOfData):
                read += batch[:, 0].tolist()
            mark(f"{len(read)} read")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(read))


@pytest.mark.timeout(LAUNCH_CAP_S + LAUNCHER_SLACK_S + 60)  # run_ranks detects a hang
def test_two_ranks_with_two_workers_each_read_their_own_share(s3, tmp_path) -> None:
    args = (_free_port(), str(tmp_path), s3.storage_options, s3.urls, str(tmp_path / "cache"))
    run_ranks(_rank_main, args, WORLD)
    shares = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(shares)
    assert not set(shares[0]) & set(shares[1])
    assert Counter(shares[0] + shares[1]) == Counter(range(N))


@pytest.mark.parametrize("client", ["fsspec", "obstore"])
def test_an_empty_object_of_known_size_is_cached_without_a_request(s3, tmp_path,
                                                                    client) -> None:
    """S3 refuses a byte range of an empty object (416), which every try would meet: an
    object its manifest says is empty is cached empty with no request, as read whole."""
    if client == "obstore":
        pytest.importorskip("obstore", reason="client='obstore' needs obstore (test extra)")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.bin").write_bytes(b"")
    s3.upload_dir(str(tmp_path / "empty"), "bucket", "empty")
    url = "s3://bucket/empty/e.bin"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**6, fetch="shard",
                         client=client)
    source.expect_sizes({url: 0})  # type: ignore[attr-defined]
    try:
        assert source.read(url) == b""
        assert source.local_path(url) is not None  # type: ignore[attr-defined]
    finally:
        source.close()  # type: ignore[attr-defined]
    assert "/bucket/empty/e.bin" not in s3.faults.gets_by_path


def test_one_source_reopened_over_a_pack_written_again_reads_the_new_pack(s3, tmp_path) -> None:
    """A source kept open while its pack is written again (same shard sizes, other bytes)
    and opened again: its pins of the old copies are let go (NOTE [ Cached copies named by
    their content ]), even with CRCs unchecked."""
    from stoker.formats import TarShards, pack

    url = "s3://bucket/kept/index.json"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7, fetch="shard")
    try:
        for base in (0, 1000):
            pack(_From(base, 29), str(tmp_path / f"pack-{base}"), samples_per_shard=4,
                 workers=1, progress=False)
            s3.upload_dir(str(tmp_path / f"pack-{base}"), "bucket", "kept")
            dataset = TarShards(url, source=source, transform=label, verify_crc=False)
            assert [dataset[i] for i in range(len(dataset))] == list(range(base, base + 29))
    finally:
        source.close()  # type: ignore[attr-defined]


def test_a_shuffled_order_the_shard_cache_cannot_hold_is_warned_about_once(s3, tmp_path) -> None:
    """NOTE [ A cache the order thrashes ]: 400 samples in 20 shards, a cache with room for 4:
    shuffled, one warning naming the switches (every sample still read, once); in order, or
    shuffled with room for every shard, none."""
    from stoker.formats import TarShards, pack

    pack(_From(0, 400), str(tmp_path / "packed"), samples_per_shard=20, workers=1,
         progress=False)
    s3.upload_dir(str(tmp_path / "packed"), "bucket", "thrash")
    url = "s3://bucket/thrash/index.json"
    shard = (tmp_path / "packed" / "shard-000000.tar").stat().st_size
    for budget_shards, shuffle, warned in ((4, True, True), (4, False, False), (25, True, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _labels_from_cache(
                s3, url, tmp_path / f"cache-{budget_shards}-{shuffle}",
                lambda source: TarShards(url, source=source, transform=label),
                shuffle=shuffle, cache_bytes=budget_shards * shard)
        assert got == list(range(400))
        thrash = [str(w.message) for w in caught if "evicted before" in str(w.message)]
        assert len(thrash) == (1 if warned else 0), (budget_shards, shuffle, thrash)
        if warned:
            assert thrash[0].startswith("TarShards: the sampler's order has read ")
            assert f"the shard cache holds {4 * shard / 2**20:.1f} MiB" in thrash[0]
            assert thrash[0].endswith(
                f"Raise cache_bytes to the dataset's {20 * shard / 2**20:.1f} MiB, read by "
                "range (open_source(..., fetch='range')), or stream the shards in order "
                "(TarShardStream)")
