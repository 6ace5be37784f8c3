"""Tar shards on real files: the index built by scanning, the map-style reader, and the errors
a truncated or corrupted shard gives (whole messages). No processes: shards are written here
with the stdlib's tarfile, as another tool (WebDataset's writer) would write them."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from stoker.formats import ShardError, TarShards, index_shard, tar_shards
from stoker.formats._common import require
from stoker.formats.tar_index import (
    TABLES_NAME,
    index_path,
    split_name,
    tables_from_bytes,
    tables_to_bytes,
)
from stoker.storage import LocalSource

# sample key -> {field: bytes}; one shard holds samples in this order
SAMPLES = [
    (f"dir/s{i:03d}", {"jpg": bytes([i]) * (100 + 37 * i), "cls": str(i % 3).encode()})
    for i in range(11)
]


def write_tar(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def expected(samples: list[tuple[str, dict[str, bytes]]], shard: Path) -> list[dict]:
    return [{"__key__": k, "__url__": str(shard), **f} for k, f in samples]


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return [
        write_tar(tmp_path / "a.tar", SAMPLES[:4]),
        write_tar(tmp_path / "b.tar", SAMPLES[4:5]),
        write_tar(tmp_path / "c.tar", SAMPLES[5:]),
    ]


def test_split_name_is_webdatasets_rule() -> None:
    assert split_name("a/b.c/x.seg.png") == ("a/b.c/x", "seg.png")
    assert split_name("plain") is None  # webdataset skips it (tests/unit/test_tar_members.py)


def test_unindexed_shards_are_scanned_and_read_exactly(shards: list[Path]) -> None:
    ds = TarShards([str(s) for s in shards])
    assert len(ds) == len(SAMPLES)
    got = [ds[i] for i in range(len(ds))]
    want = expected(SAMPLES[:4], shards[0]) + expected(SAMPLES[4:5], shards[1]) + expected(
        SAMPLES[5:], shards[2])
    assert got == want
    assert ds[-1] == want[-1]
    with pytest.raises(IndexError, match="sample index 11 out of range for 11 samples"):
        ds[11]


def test_sidecar_index_is_used_and_locates_samples(shards: list[Path]) -> None:
    tables = [index_shard(str(s)) for s in shards]
    assert all(Path(index_path(str(s))).exists() for s in shards)
    ds = TarShards([str(s) for s in shards])
    assert [s.samples for s in ds.shards] == [4, 1, 6]
    assert [s.size_bytes for s in ds.shards] == [s.stat().st_size for s in shards]
    loc = ds.locate(5)
    assert (loc.shard, loc.key) == (str(shards[2]), "dir/s005")
    raw = shards[2].read_bytes()
    for ext, (offset, size) in loc.fields.items():
        assert raw[offset : offset + size] == SAMPLES[5][1][ext]
    assert raw[loc.offset : loc.offset + loc.length].startswith(SAMPLES[5][1]["jpg"])
    assert tables[0].meta == {}


def test_transform_is_applied(shards: list[Path]) -> None:
    ds = TarShards(str(shards[0]), transform=lambda s: int(s["cls"]))
    assert [ds[i] for i in range(4)] == [0, 1, 2, 0]


def test_corrupted_member_is_named_with_its_sample(shards: list[Path]) -> None:
    index_shard(str(shards[2]))
    raw = bytearray(shards[2].read_bytes())
    loc = TarShards(str(shards[2])).locate(2)
    offset = loc.fields["jpg"][0]
    raw[offset] ^= 0xFF
    shards[2].write_bytes(bytes(raw))
    ds = TarShards(str(shards[2]))
    assert ds[1]["__key__"] == "dir/s006"  # other samples still read
    with pytest.raises(ShardError) as info:
        ds[2]
    good = TarShards(str(shards[2]), verify_crc=False).read(2)["jpg"]
    import zlib

    assert str(info.value) == (
        f"{shards[2]}: sample 2 (key 'dir/s007'), member dir/s007.jpg: CRC-32 "
        f"{zlib.crc32(good):08x}, the index says {zlib.crc32(SAMPLES[7][1]['jpg']):08x}: the "
        "shard was corrupted or changed after it was indexed; re-create it"
    )


def test_truncated_shard_without_index_is_named_at_scan(shards: list[Path]) -> None:
    raw = shards[2].read_bytes()
    start = TarShards(str(shards[2])).locate(3).offset  # sample 3's image data
    shards[2].write_bytes(raw[: start + 10])
    with pytest.raises(ShardError) as info:
        TarShards([str(s) for s in shards])
    assert str(info.value) == (
        f"{shards[2]}: truncated tar shard: sample 3 (key 'dir/s008') ends at byte "
        f"{start + len(SAMPLES[8][1]['jpg'])}, the file has {start + 10} bytes; re-create it "
        "(stoker pack redoes an unfinished shard)"
    )
    shards[2].write_bytes(raw[: start - 100])  # inside that member's header
    with pytest.raises(ShardError) as info:
        TarShards([str(s) for s in shards])
    # tarfile itself stops quietly at a header cut short: the missing end marker tells
    header = start - 512
    assert str(info.value) == _no_end(shards[2], header, start - 100)
    raw = bytearray(raw)
    raw[header + 148 : header + 156] = b"9999999\0"  # a header whose checksum is wrong
    shards[2].write_bytes(bytes(raw))
    with pytest.raises(ShardError) as info:
        TarShards([str(s) for s in shards])
    assert str(info.value) == _no_end(shards[2], header, len(raw))


def _no_end(shard: Path, offset: int, size: int) -> str:
    return (
        f"{shard}: truncated or corrupted tar shard: neither a valid member header nor the "
        f"end-of-archive marker at byte {offset}, after sample 2 (key 'dir/s007') (the file "
        f"has {size} bytes); re-create it (stoker pack redoes an unfinished shard)"
    )


def test_scan_samples_gives_each_sample_before_the_damage_after_it(shards: list[Path]) -> None:
    """NOTE [ A bare shard read as it arrives ] (formats/tar_arriving.py): parsed through a
    file, each sample comes with its members' places once the header after it is read; on a
    header with a wrong checksum the samples before it have come, then the whole scan's error."""
    from stoker.formats._common import ViewFile
    from stoker.formats.tar_index import scan_samples

    raw = bytearray(shards[2].read_bytes())
    table = TarShards(str(shards[2])).table(0)
    got = list(scan_samples(ViewFile(memoryview(bytes(raw))), len(raw), str(shards[2])))
    assert [key for key, _ in got] == [k for k, _ in SAMPLES[5:]]
    for (_key, members), (_, fields) in zip(got, SAMPLES[5:], strict=True):
        assert {m.field: bytes(raw[m.offset : m.offset + m.length]) for m in members} == fields
    header = int(table.offsets[table.starts[3]]) - 512  # sample 3's first member
    raw[header + 148 : header + 156] = b"9999999\0"
    samples = scan_samples(ViewFile(memoryview(bytes(raw))), len(raw), str(shards[2]))
    assert [next(samples)[0] for _ in range(2)] == ["dir/s005", "dir/s006"]
    with pytest.raises(ShardError) as info:
        next(samples)  # sample 2 is given once the header after it is read: it is not
    assert str(info.value) == _no_end(shards[2], header, len(raw))


class RangeOnly(LocalSource):
    """Local files reached only by read/read_range, as an object store's are."""

    def local_path(self, path: str) -> None:
        return None


def test_truncated_shard_with_manifest_is_named(
    tmp_path: Path, shards: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for s in shards:
        index_shard(str(s))
    sizes = [s.stat().st_size for s in shards]
    manifest = {
        "format": "stoker-tar-shards", "version": 1, "samples": 11,
        "shards": [{"path": s.name, "samples": n, "size_bytes": b}
                   for s, n, b in zip(shards, [4, 1, 6], sizes, strict=True)],
    }
    (tmp_path / "index.json").write_text(json.dumps(manifest))
    assert len(TarShards(str(tmp_path))) == 11
    assert len(TarShards(str(tmp_path), source=RangeOnly())) == 11
    shards[1].write_bytes(shards[1].read_bytes()[:700])
    message = (
        f"{tmp_path}/b.tar: the shard is 700 bytes and its index has 1 samples; the index "
        f"says {sizes[1]} bytes and the manifest 1 samples: the shard changed or was "
        "truncated after it was indexed; re-create it (stoker pack redoes an unfinished shard)"
    )
    for source in (None, RangeOnly()):  # sidecars are read at open, remote ones while few
        with pytest.raises(ShardError) as info:
            TarShards(str(tmp_path), source=source)
        assert str(info.value) == message
    monkeypatch.setattr(tar_shards, "_EAGER_REMOTE_INDEXES", 2)  # more: on first use
    remote = TarShards(str(tmp_path), source=RangeOnly())
    assert remote[0]["__key__"] == "dir/s000" and remote[10]["__key__"] == "dir/s010"
    assert remote[0] == TarShards([str(s) for s in shards[:1]])[0]
    with pytest.raises(ShardError) as info:
        remote[4]
    assert str(info.value) == message


def _manifest_with_tables(directory: Path, shards: list[Path]) -> list:
    """What ``stoker pack`` writes beside its shards: sidecars, the one file of every index,
    and a manifest naming it."""
    tables = [index_shard(str(s)) for s in shards]
    data = tables_to_bytes(tables)
    (directory / TABLES_NAME).write_bytes(data)
    (directory / "index.json").write_text(json.dumps({
        "format": "stoker-tar-shards", "version": 1, "samples": 11, "tables": TABLES_NAME,
        "tables_bytes": len(data), "shards": [
            {"path": s.name, "samples": len(t), "size_bytes": t.size_bytes}
            for s, t in zip(shards, tables, strict=True)]}))
    return tables


def test_the_file_of_all_indexes_equals_the_sidecars(tmp_path: Path, shards: list[Path]) -> None:
    tables = _manifest_with_tables(tmp_path, shards)
    from_file = tables_from_bytes((tmp_path / TABLES_NAME).read_bytes(), "x")
    assert len(from_file) == 3 and all(a.same_as(b) for a, b in zip(from_file, tables,
                                                                      strict=True))
    for source in (None, RangeOnly()):
        ds = TarShards(str(tmp_path), source=source)
        assert [ds[i] for i in range(11)] == [
            ds_i for s in shards for ds_i in TarShards([str(s)])]
    (tmp_path / "a.tar.idx.npz").unlink()  # not needed: the one file has it
    assert TarShards(str(tmp_path), source=RangeOnly())[0]["__key__"] == "dir/s000"
    assert tables_from_bytes(tables_to_bytes([]), "empty") == []


def test_a_damaged_or_mismatched_file_of_indexes_is_named(
    tmp_path: Path, shards: list[Path]
) -> None:
    _manifest_with_tables(tmp_path, shards)
    good = (tmp_path / TABLES_NAME).read_bytes()
    (tmp_path / TABLES_NAME).write_bytes(good[: len(good) // 2])
    with pytest.raises(ShardError) as info:
        TarShards(str(tmp_path))
    assert str(info.value).startswith(f"{tmp_path}/{TABLES_NAME}: not a stoker index of shards (")
    assert str(info.value).endswith(
        "expected the index.tables.npz `stoker pack` writes: delete it (the shards' own "
        ".idx.npz files are read instead) or pack again")
    (tmp_path / TABLES_NAME).write_bytes(tables_to_bytes(
        [index_shard(str(s)) for s in shards[:2]]))
    with pytest.raises(ShardError) as info:
        TarShards(str(tmp_path))
    assert str(info.value) == (
        f"{tmp_path}/{TABLES_NAME}: indexes of 2 shards, the manifest lists 3: the two were "
        "not written by the same pack; pack again")
    (tmp_path / TABLES_NAME).write_bytes(good)
    shards[1].write_bytes(shards[1].read_bytes()[:700])
    with pytest.raises(ShardError, match="b.tar: the shard is 700 bytes"):
        TarShards(str(tmp_path), source=RangeOnly())


def test_not_a_manifest_says_what_was_expected(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"format": "other"}')
    with pytest.raises(ShardError) as info:
        TarShards(str(tmp_path))
    assert str(info.value) == (
        f"{tmp_path}/index.json: not a stoker shard manifest (ValueError: format is 'other'); "
        "expected the index.json that `stoker pack` writes, or pass the list of shard paths "
        "instead"
    )


def test_missing_extra_says_how_to_install() -> None:
    with pytest.raises(ImportError) as info:
        require("no_such_module_here", "parquet", "stoker.formats.ParquetDataset")
    assert str(info.value) == (
        "stoker.formats.ParquetDataset needs the 'no_such_module_here' package, which is not "
        "installed. Install it with: pip install 'stoker[parquet]'"
    )


# -- TarShardStream: the iterable reader for shards without an index --------------------------


def _keys(stream: object) -> list[str]:
    return [s["__key__"] for s in stream]  # type: ignore[attr-defined]


def test_stream_yields_every_sample_once_shuffled_per_epoch(shards: list[Path]) -> None:
    from stoker.formats import TarShardStream

    stream = TarShardStream([str(s) for s in shards], shuffle_buffer=4, seed=1)
    first = _keys(stream)
    assert sorted(first) == [k for k, _ in SAMPLES]
    assert _keys(stream) == first, "same seed and epoch: same order"
    stream.set_epoch(1)
    second = _keys(stream)
    assert sorted(second) == sorted(first) and second != first
    by_key = {k: f for k, f in SAMPLES}
    assert all(s["jpg"] == by_key[s["__key__"]]["jpg"] for s in stream)


def test_stream_without_buffer_keeps_each_shard_in_order(shards: list[Path]) -> None:
    from stoker.formats import TarShardStream

    keys = _keys(TarShardStream([str(s) for s in shards], shuffle_buffer=0, seed=3))
    runs = [[k for k, _ in SAMPLES[:4]], [k for k, _ in SAMPLES[4:5]], [k for k, _ in SAMPLES[5:]]]
    starts = sorted(runs, key=lambda run: keys.index(run[0]))
    assert keys == [k for run in starts for k in run]


def test_stream_buffer_starts_small_and_never_moves_a_sample_more_than_its_size(
    tmp_path: Path
) -> None:
    from stoker.formats import TarShardStream

    many = [(f"k{i:04d}", {"cls": str(i).encode()}) for i in range(400)]
    paths = [str(write_tar(tmp_path / f"{k}.tar", many[k * 50 : (k + 1) * 50]))
             for k in range(8)]
    arrival = {k: p for p, k in enumerate(_keys(TarShardStream(paths, shuffle_buffer=0,
                                                                seed=5)))}
    for initial in (1, 10, 60):
        out = _keys(TarShardStream(paths, shuffle_buffer=60, shuffle_initial=initial, seed=5))
        assert sorted(out) == sorted(arrival)
        assert arrival[out[0]] < initial + 1  # the first comes from the first samples in
        assert all(t >= arrival[k] - 60 for t, k in enumerate(out))
        assert max(arrival[k] - t for t, k in enumerate(out)) > 30  # and it does mix
    with pytest.raises(ValueError, match="shuffle_initial=0: expected 1 or more"):
        TarShardStream(paths, shuffle_initial=0)


def test_stream_names_a_truncated_shard(shards: list[Path]) -> None:
    from stoker.formats import TarShardStream

    raw = shards[0].read_bytes()
    shards[0].write_bytes(raw[:1000])
    with pytest.raises(ShardError) as info:
        list(TarShardStream([str(shards[0])]))
    assert str(info.value) == (  # the header of sample 1 fits, its data is cut
        f"{shards[0]}: not a readable tar shard: unexpected end of data after sample 0 (key "
        "'dir/s000'); the file is truncated or corrupted: re-create it (stoker pack redoes an "
        "unfinished shard)"
    )


def test_pack_options_are_checked() -> None:
    from stoker.formats import PackOptions

    with pytest.raises(ValueError) as info:
        PackOptions(samples_per_shard=0)
    assert str(info.value) == "samples_per_shard=0: expected a positive int or None"
    with pytest.raises(ValueError) as info:
        PackOptions(jpeg_quality=101)
    assert str(info.value) == "jpeg_quality=101: expected 1 to 100"
    with pytest.raises(ValueError) as info:
        PackOptions(name="a/b")
    assert str(info.value) == "name='a/b': expected a file name prefix such as 'shard'"


def test_random_reads_keep_no_per_sample_objects(tmp_path: Path) -> None:
    """NOTE [ Index columns per process ]: a worker reading samples here and there holds
    views of the index's arrays, not a Python object per sample (lists were ~280 bytes a
    sample, for every shard read, in every worker)."""
    import tracemalloc

    import numpy as np

    n = 20_000
    shard = write_tar(tmp_path / "big.tar", [(f"k{i:06d}", {"cls": b"%d" % (i % 7)})
                                             for i in range(n)])
    ds = TarShards(str(shard))
    table = ds.table(0)
    picks = np.random.default_rng(0).integers(0, n, 50).tolist()
    tracemalloc.start()
    try:
        got = [ds[i] for i in picks]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [{"__key__": f"k{i:06d}", "__url__": str(shard), "cls": b"%d" % (i % 7)}
                   for i in picks]
    assert all(type(s["__key__"]) is str for s in got)
    assert held < 20 * n, f"{held} bytes held after 50 reads of a {n}-sample shard"
    assert np.shares_memory(np.asarray(table.columns.offsets), table.offsets)
    lists = table.as_lists()  # the stream's way: the same values
    columns = table.columns
    for j in (0, n // 2, n - 1):
        assert [columns.starts[j], columns.keys[j], columns.fields[j], columns.offsets[j],
                columns.sizes[j], columns.crc32[j]] == [column[j] for column in lists]
