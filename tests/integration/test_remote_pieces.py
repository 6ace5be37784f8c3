"""NOTE [ Pieces of large objects ] (``storage/remote.py``) against the real S3 server of
``test_remote_storage``: shards larger than twice ``piece_bytes`` are cached by pieces, so a
shuffled batch waits for the pieces holding its samples instead of whole shards. The epoch
equals the local one (samples crossing a piece boundary included, CRCs checked), every piece
is downloaded exactly once, by the main process when it fetches for its workers, through
injected faults; resume is exact; small objects stay whole. And large shards read while they
arrive (NOTE [ Reading a shard while it arrives ], [ A bare shard read as it arrives ]), and a
worker's download in flight given up when it exits (NOTE [ A download gives up at exit ])."""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from _s3_server import SERVER_NEEDS
from torch.utils.data import Dataset

from _optional import skip_module_unless

skip_module_unless(
    *SERVER_NEEDS,
    ("s3fs", "reading s3:// needs s3fs (test extra)"),
)

from _remote_datasets import FAST_RETRY, LabelAndClient, epoch_samples  # noqa: E402
from _s3_server import S3Server  # noqa: E402
from test_tar_stream import label  # noqa: E402

import stoker  # noqa: E402
from stoker.formats import TarShards, pack  # noqa: E402
from stoker.storage import open_source  # noqa: E402
from stoker.testing import assert_resumes_exactly  # noqa: E402

PIECE = 4096  # shards of ~20 KB: 5-6 pieces each, samples of ~2.5 KB crossing their edges
SAMPLES, PER_SHARD = 40, 8


class Blobs(Dataset):
    """Sample ``i``: its label and 700 bytes that depend on it."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"cls": i, "bin": bytes((i * 7 + k) % 251 for k in range(700))}


def label_and_check(sample: dict[str, Any]) -> int:
    i = int(sample["cls"])
    assert sample["bin"] == Blobs()[i]["bin"]
    return i


@pytest.fixture
def packed(tmp_path: Path):
    out = tmp_path / "packed"
    pack(Blobs(), str(out), samples_per_shard=PER_SHARD, workers=1, progress=False)
    with S3Server() as s3:
        s3.client().create_bucket(Bucket="bucket")
        s3.upload_dir(str(out), "bucket", "p")
        yield s3, out


def _source(s3: S3Server, tmp_path: Path, **options: Any) -> Any:
    return open_source("s3://bucket/p/index.json", storage_options=s3.storage_options,
                       retry=FAST_RETRY, cache_dir=str(tmp_path / "cache"),
                       cache_bytes=10**7, fetch="shard", **options)


def _epoch(dataset: Any, workers: int) -> list[Any]:
    return epoch_samples(stoker.DataLoader(
        dataset, batch_size=5, shuffle=True, num_workers=workers,
        timeout=60 if workers else 0, generator=torch.Generator().manual_seed(3)))


def _shard_gets(s3: S3Server, out: Path) -> dict[str, int]:
    shards = {f"/bucket/p/{p.name}" for p in out.glob("*.tar")}
    return {p: s3.faults.gets_by_path.get(p, 0) for p in shards}


def _pieces(out: Path) -> dict[str, int]:
    """Per shard, the pieces its samples lie in: all up to its last sample's (a tar's
    end-of-archive blocks, after it, are never read)."""
    local = TarShards(str(out / "index.json"))
    ends = {}
    for s, shard in enumerate(local.shards):
        table = local.table(s)
        ends[f"/bucket/p/{Path(shard.path).name}"] = math.ceil(
            sum(table.span(len(table) - 1)) / PIECE)
    return ends


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_epoch_by_pieces_is_the_local_one_with_each_piece_fetched_once(
        packed, tmp_path, workers) -> None:
    s3, out = packed
    assert all(p.stat().st_size > 2 * PIECE for p in out.glob("*.tar"))
    source = _source(s3, tmp_path, piece_bytes=PIECE)
    try:
        got = _epoch(TarShards("s3://bucket/p/index.json", source=source,
                               transform=LabelAndClient(source)), workers)
    finally:
        source.close()
    want = _epoch(TarShards(str(out / "index.json"), transform=label_and_check), 0)
    assert [int(x) for x, _ in got] == want and sorted(want) == list(range(SAMPLES))
    # Each piece once: one ranged GET per piece of each shard, not a whole shard's GET.
    assert _shard_gets(s3, out) == _pieces(out)
    if workers:  # the main process fetched them all: no worker opened a client
        assert not any(connected for _, connected in got)
    cached = list((tmp_path / "cache").glob("*piece*"))
    assert len(cached) == sum(_pieces(out).values())


def test_pieces_are_retried_through_faults_and_resume_is_exact(packed, tmp_path) -> None:
    s3, out = packed
    source = _source(s3, tmp_path, piece_bytes=PIECE, main_downloads=False)
    dataset = TarShards("s3://bucket/p/index.json", source=source, transform=label_and_check)
    s3.faults.fail("status", "shard-000001.tar", times=2)
    s3.faults.fail("reset", "shard-000003.tar", times=1)

    def make_loader() -> stoker.DataLoader:
        return stoker.DataLoader(dataset, batch_size=5, shuffle=True, num_workers=2,
                                 generator=torch.Generator().manual_seed(9), timeout=60)

    try:
        first = [x for batch in make_loader() for x in batch.tolist()]
        check = assert_resumes_exactly(make_loader, epochs=1, steps=[1, 4])
    finally:
        source.close()
    assert sorted(first) == list(range(SAMPLES))
    assert s3.faults.injected == 3
    assert check is not None


def test_objects_up_to_twice_the_piece_size_stay_whole(packed, tmp_path) -> None:
    s3, out = packed
    source = _source(s3, tmp_path)  # the default: 1 MiB pieces, shards of ~20 KB
    try:
        got = _epoch(TarShards("s3://bucket/p/index.json", source=source,
                               transform=label_and_check), 2)
    finally:
        source.close()
    assert sorted(got) == list(range(SAMPLES))
    assert set(_shard_gets(s3, out).values()) == {1}
    assert not list((tmp_path / "cache").glob("*piece*"))


def test_a_sample_across_two_pieces_is_read_whole_and_a_range_past_the_end_is_named(
        packed, tmp_path) -> None:
    s3, out = packed
    source = _source(s3, tmp_path, piece_bytes=PIECE)
    shard = "s3://bucket/p/shard-000000.tar"
    local = (out / "shard-000000.tar").read_bytes()
    try:
        TarShards("s3://bucket/p/index.json", source=source)  # the manifest: shard sizes
        assert source.pieces_of(shard, PIECE - 10, 20) == [
            f"{shard}\0piece:0", f"{shard}\0piece:1"]
        assert zlib.crc32(source.read_range(shard, PIECE - 10, 20)) == zlib.crc32(
            local[PIECE - 10: PIECE + 10])
        assert source.read_range(shard, 0, len(local)) == local  # every piece of it
        with pytest.raises(OSError, match="shorter than its index says"):
            source.read_range(shard, len(local) - 5, 10)
    finally:
        source.close()
    with pytest.raises(ValueError, match="piece_bytes=0: expected a positive int"):
        _source(s3, tmp_path, piece_bytes=0)


def _stream_epoch(dataset: Any, workers: int) -> list[Any]:
    return epoch_samples(stoker.DataLoader(dataset, batch_size=5, num_workers=workers,
                                           timeout=60 if workers else 0))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_over_a_pack_reads_pieces_as_they_come_in_the_local_order(
        packed, tmp_path, workers) -> None:
    """NOTE [ A stream of pieces ]: the same samples in the same order as the local pack,
    each piece fetched once, by the main process for its workers (none opens a client)."""
    from stoker.formats import TarShardStream

    s3, out = packed
    source = _source(s3, tmp_path, piece_bytes=PIECE)
    options = {"shuffle_buffer": 12, "shuffle_initial": 3, "seed": 5}
    try:
        got = _stream_epoch(TarShardStream("s3://bucket/p/index.json", source=source,
                                           transform=LabelAndClient(source), **options),
                            workers)
    finally:
        source.close()
    want = _stream_epoch(TarShardStream(str(out / "index.json"), transform=label_and_check,
                                        **options), workers)
    assert [int(x) for x, _ in got] == want and sorted(want) == list(range(SAMPLES))
    assert _shard_gets(s3, out) == _pieces(out)
    if workers:
        assert not any(connected for _, connected in got)


def test_a_stream_of_pieces_raises_at_the_first_sample_not_as_its_index_says(
        packed, tmp_path) -> None:
    from stoker.errors import ShardError
    from stoker.formats import TarShardStream

    s3, out = packed
    shard = out / "shard-000002.tar"
    data = bytearray(shard.read_bytes())
    data[PIECE + 100] ^= 0xFF  # the second sample's "bin", in the second piece
    s3.client().put_object(Bucket="bucket", Key="p/shard-000002.tar", Body=bytes(data))
    source = _source(s3, tmp_path, piece_bytes=PIECE)
    stream = TarShardStream("s3://bucket/p/index.json", source=source, transform=label,
                            shuffle_buffer=0)
    try:
        with pytest.raises(ShardError, match="shard-000002.tar"):
            list(stoker.DataLoader(stream, batch_size=5))
    finally:
        source.close()


class Megabytes(Dataset):
    """8 samples of 1 MiB each: one shard of ~8 MiB."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"cls": i, "bin": bytes([i]) * (1 << 20)}


@pytest.mark.parametrize("reader", ["TarShards", "TarShardStream", "bare TarShardStream"])
def test_a_sample_is_read_while_its_shard_is_still_arriving(tmp_path, reader) -> None:
    """NOTE [ Reading a shard while it arrives ] (storage/cache.py): with the server capped at
    1 MB/s the 8 MiB shard (over 2 MiB: streamed to disk, not read whole first) takes ~8 s to
    arrive; its first sample is read from the download in flight (the main process's claim
    for TarShards, the stream's own prefetch thread), long before the shard is cached whole.
    Then the cap goes and the rest is read: one GET. A stream over the bare shard (no pack's
    index) parses its tar headers as they arrive (NOTE [ A bare shard read as it arrives ] in
    formats/tar_arriving.py)."""
    from stoker.formats import TarShardStream

    out = tmp_path / "packed"
    pack(Megabytes(), str(out), samples_per_shard=8, workers=1, progress=False)
    with S3Server() as s3:
        s3.client().create_bucket(Bucket="bucket")
        s3.upload_dir(str(out), "bucket", "p")
        source = _source(s3, tmp_path)
        url = "s3://bucket/p/index.json"
        try:
            if reader == "TarShards":
                dataset = TarShards(url, source=source)
                shard = dataset.shards[0].path
                s3.faults.bandwidth_bps = 1e6
                dataset.stoker_fetch_for_batch([0])  # the main process's download
                first = dataset[0]
            else:
                shards = url if reader == "TarShardStream" else "s3://bucket/p/shard-000000.tar"
                stream = TarShardStream(shards, source=source, shuffle_buffer=0)
                shard = stream.shards[0]
                s3.faults.bandwidth_bps = 1e6
                samples = iter(stream)
                first = next(samples)
            arrived_first = not source.cache.cached(shard)
            s3.faults.bandwidth_bps = 0
            rest = [dataset[i] for i in range(1, 8)] if reader == "TarShards" else list(samples)
        finally:
            source.close()
        gets = s3.faults.gets_by_path.get("/bucket/p/shard-000000.tar")
        client = s3.client()  # moto keeps an object this large in a temporary file: let it go
        for key in client.list_objects_v2(Bucket="bucket")["Contents"]:
            client.delete_object(Bucket="bucket", Key=key["Key"])
    assert arrived_first  # read before the shard was whole
    assert [int(s["cls"]) for s in [first, *rest]] == list(range(8))
    assert all(s["bin"] == bytes([int(s["cls"])]) * (1 << 20) for s in [first, *rest])
    assert gets == 1


def test_a_bare_shard_larger_than_the_cache_is_read_by_one_get(tmp_path) -> None:
    """NOTE [ A bare shard read as it arrives ]: a shard that cannot be cached is not parsed
    through the cache (a range request per tar header): it is read whole, as before."""
    from stoker.formats import TarShardStream

    out = tmp_path / "packed"
    pack(Megabytes(), str(out), samples_per_shard=8, workers=1, progress=False)
    with S3Server() as s3:
        s3.client().create_bucket(Bucket="bucket")
        s3.upload_dir(str(out), "bucket", "p")
        source = open_source("s3://bucket/p/shard-000000.tar",
                             storage_options=s3.storage_options, retry=FAST_RETRY,
                             cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 20,
                             fetch="shard")
        try:
            got = list(TarShardStream("s3://bucket/p/shard-000000.tar", source=source,
                                      shuffle_buffer=0))
        finally:
            source.close()
        gets = s3.faults.gets_by_path.get("/bucket/p/shard-000000.tar")
        client = s3.client()
        for key in client.list_objects_v2(Bucket="bucket")["Contents"]:
            client.delete_object(Bucket="bucket", Key=key["Key"])
    assert [int(s["cls"]) for s in got] == list(range(8))
    assert all(s["bin"] == bytes([int(s["cls"])]) * (1 << 20) for s in got)
    assert gets == 1


def test_a_worker_stopped_mid_download_exits_without_finishing_it(tmp_path) -> None:
    """NOTE [ A download gives up at exit ] (storage/exit_watch.py): a stream's worker reads a
    bare 8 MiB shard as it arrives over a 2 MB/s link. Stopped after its first batch, it exits
    without finishing the download (~4 s more, within the loader's 5 s wait for a worker to
    exit, which it used to spend waiting): the shard is not cached, no partial file is left."""
    from stoker.formats import TarShardStream

    out = tmp_path / "packed"
    pack(Megabytes(), str(out), samples_per_shard=8, workers=1, progress=False)
    url = "s3://bucket/p/shard-000000.tar"
    with S3Server() as s3:
        s3.client().create_bucket(Bucket="bucket")
        s3.upload_dir(str(out), "bucket", "p")
        source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                             cache_dir=str(tmp_path / "cache"), cache_bytes=10**8,
                             fetch="shard")
        try:
            s3.faults.bandwidth_bps = 2e6
            loader = stoker.DataLoader(TarShardStream(url, source=source, shuffle_buffer=0),
                                       batch_size=1, num_workers=1, timeout=60)
            batches = iter(loader)
            first = next(batches)
            del batches  # the worker stops: its download in flight with it
            cached = source.cache.cached(url)
            partials = sorted(p.name for p in (tmp_path / "cache").rglob("*.partial"))
            s3.faults.bandwidth_bps = 0
        finally:
            source.close()
        client = s3.client()
        for key in client.list_objects_v2(Bucket="bucket")["Contents"]:
            client.delete_object(Bucket="bucket", Key=key["Key"])
    assert int(first["cls"][0]) == 0
    assert not cached and partials == []
