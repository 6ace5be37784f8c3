"""``open_source(..., client="obstore")`` against the same real S3 server as
``test_remote_storage`` (moto behind the fault-injecting proxy): epochs equal to the local
copy, transient faults retried by stoker's policy without losing or repeating a sample, a
missing object named at once, and the fork rule of NOTE [ The obstore client ]: a worker
forked after the main process started obstore downloads with s3fs instead of hanging."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from _s3_server import SERVER_NEEDS

from _optional import skip_module_unless

skip_module_unless(
    *SERVER_NEEDS,
    ("s3fs", "client='obstore' falls back to s3fs in forked workers"),
    ("obstore", "client='obstore' needs obstore (test extra)"),
)

from _remote_datasets import (  # noqa: E402
    FAST_RETRY,
    Records,
    epoch_samples,
    on_small_disk,
    record_indices,
    records_on_server,
)
from _s3_server import S3Server  # noqa: E402
from test_tar_stream import Numbers, label  # noqa: E402

import stoker  # noqa: E402
from stoker.storage import LocalSource, RemoteReadError, open_source  # noqa: E402
from stoker.storage.obstore_files import ObstoreFiles, obstore_config  # noqa: E402

SHARDS, PER_SHARD, BATCH = 4, 16, 8
N = SHARDS * PER_SHARD


@pytest.fixture
def s3(tmp_path: Path):
    with records_on_server(tmp_path, SHARDS, PER_SHARD) as server:
        yield server


def _source(s3: S3Server, **options: Any) -> Any:
    return open_source(s3.urls[0], storage_options=s3.storage_options, retry=FAST_RETRY,
                       client="obstore", **options)


def _epoch(dataset: Any, **kwargs: Any) -> list[list[int]]:
    loader = stoker.DataLoader(dataset, batch_size=BATCH, timeout=60 if kwargs.get(
        "num_workers") else 0, generator=torch.Generator().manual_seed(5), shuffle=True,
        **kwargs)
    return [b[:, 0].tolist() + b[:, 1].tolist() for b in loader]


def _local_epoch(s3: S3Server, **kwargs: Any) -> list[list[int]]:
    return _epoch(Records(LocalSource(), s3.local_urls, PER_SHARD), **kwargs)


def _client_kind(source: Any) -> str:
    """The client this process opened (obstore's or s3fs's), or "none"."""
    if not source.connected:
        return "none"
    return "obstore" if isinstance(source._handle.fs, ObstoreFiles) else "fsspec"


class _ClientOf:
    """A packed ``Numbers`` sample's label, and which client the reading process opened."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __call__(self, sample: dict[str, bytes]) -> tuple[int, str]:
        return int(sample["cls"]), _client_kind(self.source)


class _RecordsAndClient(Records):
    """``Records``' sample with the client its process read it with."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        return super().__getitem__(i), _client_kind(self.source)


def test_storage_options_are_mapped_and_what_has_no_counterpart_is_named() -> None:
    options = {"key": "k", "secret": "s", "token": "t", "client_kwargs": {
        "endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}}
    assert obstore_config("s3", options) == {
        "access_key_id": "k", "secret_access_key": "s", "session_token": "t",
        "endpoint": "http://127.0.0.1:9", "region": "eu-west-1",
        "client_options": {"allow_http": True}}
    assert obstore_config("s3", {"anon": True}) == {"skip_signature": True}
    with pytest.raises(ValueError, match=r"\['profile', 'client_kwargs.verify'\] have no "
                                         "obstore counterpart"):
        obstore_config("s3", {"profile": "x", "client_kwargs": {"verify": False}})
    with pytest.raises(ValueError, match="reads s3:// here, not gs://"):
        open_source("gs://b/x", client="obstore")
    with pytest.raises(ValueError, match="client='s3fs': expected 'auto', 'fsspec' or 'obstore'"):
        open_source("s3://b/x", client="s3fs")


@pytest.mark.parametrize("workers", [0, 2])
def test_ranged_reads_equal_the_local_files_through_faults(s3, workers) -> None:
    """Each sample by one ranged GET; 5xx, resets and bodies cut short are retried by
    stoker's policy (obstore's own retries are off), so the epoch is exactly the local one."""
    source = _source(s3, fetch="range")
    for s, kind in enumerate(["status", "reset", "truncate", "status"]):
        s3.faults.fail(kind, f"shard-{s:04d}", times=2)
    try:
        got = _epoch(Records(source, s3.urls, PER_SHARD), num_workers=workers)
    finally:
        source.close()
    assert s3.faults.injected == 8
    assert got == _local_epoch(s3, num_workers=workers)
    assert record_indices(got) == Counter(range(N))


def test_a_missing_object_is_named_at_once_and_one_that_keeps_failing_after_retries(
    s3
) -> None:
    source = _source(s3, fetch="range")
    try:
        with pytest.raises(FileNotFoundError, match=r"^s3://bucket/data/nope.bin: no such "
                                                    "object"):
            source.read_range("s3://bucket/data/nope.bin", 0, 10)
        assert s3.faults.gets_by_path["/bucket/data/nope.bin"] == 1
        s3.faults.fail("status", "shard-0001", times=-1, status=503)
        with pytest.raises(RemoteReadError) as info:
            source.read_range(s3.urls[1], 256, 256)
        assert (info.value.url, info.value.attempts) == (s3.urls[1], 5)
        assert str(info.value).startswith(f"reading {s3.urls[1]} (bytes 256..512) failed "
                                          "after 5 attempt(s), the last error: OSError: ")
    finally:
        source.close()


def test_whole_objects_are_cached_once_and_one_of_another_size_is_named(s3, tmp_path) -> None:
    source = _source(s3, fetch="shard", cache_dir=str(tmp_path / "c"), cache_bytes=10**6)
    sizes = [Path(p).stat().st_size for p in s3.local_urls]
    source.expect_sizes({s3.urls[0]: sizes[0], s3.urls[1]: sizes[1] - 1})
    try:
        assert source.read(s3.urls[0]) == Path(s3.local_urls[0]).read_bytes()
        assert source.read(s3.urls[0]) == Path(s3.local_urls[0]).read_bytes()
        assert s3.faults.gets_by_path["/bucket/data/shard-0000.bin"] == 1
        with pytest.raises(RemoteReadError, match=f"the object is over {sizes[1] - 1} bytes"):
            source.read(s3.urls[1])
        assert source.local_path(s3.urls[1]) is None
    finally:
        source.close()
    listed = _source(s3, fetch="range")
    try:
        listed.learn_sizes(s3.urls)  # one listing, through obstore
        assert [listed.known_size(u) for u in s3.urls] == sizes
    finally:
        listed.close()
    asked = _source(s3, fetch="range")
    try:
        assert asked.size(s3.urls[3]) == sizes[3]  # a HEAD request
        with pytest.raises(FileNotFoundError):
            asked.size("s3://bucket/data/nope.bin")
    finally:
        asked.close()


@pytest.mark.parametrize("failing", [False, True])
def test_the_main_process_downloads_with_obstore_and_a_forked_worker_falls_back_to_s3fs(
    s3, tmp_path, failing
) -> None:
    """Shuffled TarShards, 2 forked workers: the main process reads the manifest and every
    shard with obstore, no worker opens a client; when the main process's download of a
    shard fails for good, the worker waiting for it downloads it itself, with s3fs (obstore
    cannot run in a child forked after it started), and the epoch is the local one."""
    from stoker.formats import TarShards, pack

    packed = tmp_path / "packed"
    pack(Numbers(), str(packed), samples_per_shard=4, workers=1, progress=False)
    s3.upload_dir(str(packed), "bucket", "tars")
    url = "s3://bucket/tars/index.json"
    source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7, fetch="shard",
                         client="obstore")
    remote = TarShards(url, source=source, transform=_ClientOf(source))
    assert isinstance(source._handle.fs, ObstoreFiles)  # the manifest, read here
    if failing:
        s3.faults.fail("status", "shard-000003.tar", times=FAST_RETRY.attempts)
    loader = stoker.DataLoader(remote, batch_size=5, shuffle=True, num_workers=2, timeout=60,
                               generator=torch.Generator().manual_seed(4),
                               multiprocessing_context="fork")
    try:
        got = epoch_samples(loader)
    finally:
        source.close()
    local = TarShards(str(packed / "index.json"), transform=label)
    want = epoch_samples(stoker.DataLoader(local, batch_size=5, shuffle=True,
                                           generator=torch.Generator().manual_seed(4)))
    assert [int(x) for x, _ in got] == want and sorted(want) == list(range(29))
    shards = {f"/bucket/tars/{Path(s.path).name}" for s in local.shards}
    gets = {p: n for p, n in s3.faults.gets_by_path.items() if p in shards}
    faulty = "/bucket/tars/shard-000003.tar"
    assert set(gets) == shards and all(n == 1 for p, n in gets.items() if p != faulty)
    kinds = {kind for _, kind in got}
    if failing:
        assert gets[faulty] == FAST_RETRY.attempts + 1  # the main's 5 tries, a worker's one
        assert kinds == {"none", "fsspec"}  # the worker that needed it: s3fs, not obstore
    else:
        assert gets[faulty] == 1
        # no worker opened a client; else, what s3fs asked (botocore's User-Agent)
        assert kinds == {"none"}, [r for r in s3.faults.requests if "botocore" in r[2].lower()]


def test_spawned_workers_use_obstore_themselves(s3) -> None:
    """A spawned worker never inherited obstore's runtime: it starts its own."""
    source = _source(s3, fetch="range")
    loader = stoker.DataLoader(_RecordsAndClient(source, s3.urls, PER_SHARD), batch_size=BATCH,
                               num_workers=2, timeout=60, multiprocessing_context="spawn")
    try:
        got = [(b[:, 0].tolist(), kinds) for b, kinds in loader]
    finally:
        source.close()
    assert sorted(i for ids, _ in got for i in ids) == list(range(N))
    assert {k for _, kinds in got for k in kinds} == {"obstore"}


@pytest.mark.filterwarnings("ignore:stoker. the disk under the shard cache")
def test_a_full_disk_under_the_cache_is_read_by_range_with_obstore(s3, tmp_path) -> None:
    """NOTE [ A full disk under the cache ] with obstore's downloads (written from its own
    buffer): 12 KiB of real disk holds some of the shards; the others are read
    by range, and the epoch has every record once."""
    with on_small_disk(tmp_path / "small-disk", "12k") as disk:
        source = _source(s3, fetch="shard", cache_dir=str(disk / "cache"),
                         cache_bytes=10**7)
        try:
            got = _epoch(Records(source, s3.urls, PER_SHARD))
        finally:
            source.close()
        assert record_indices(got) == record_indices(_local_epoch(s3))
        assert sum(n for n in record_indices(got).values()) == SHARDS * PER_SHARD
        cached = [n for n in os.listdir(disk / "cache") if n.endswith(".bin")]
        assert 0 < len(cached) < SHARDS  # the disk took some: the rest were read by range
        assert not [n for n in os.listdir(disk / "cache") if n.endswith(".partial")]
