"""Which tar members make which samples (WebDataset's rules, compared with ``webdataset``
itself when it is installed), the shards stoker refuses (duplicate fields, sparse members,
files that are no tar), shard patterns, and what opening a dataset checks. Shards are written
here with the stdlib's tarfile; whole error messages are asserted."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import json
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from stoker.formats import ShardError, TarShards, TarShardStream, index_shard
from stoker.formats._common import expand_braces
from stoker.formats.tar_index import (
    TABLES_NAME,
    ShardTable,
    index_path,
    tables_from_bytes,
    tables_to_bytes,
)
from stoker.formats.tar_members import split_name


def write_tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT,
              kind: bytes = tarfile.REGTYPE) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            tar.addfile(info, io.BytesIO(data))
    return path


def bare(sample: dict) -> dict:
    """A sample without ``__url__`` (and webdataset's ``__local_path__``), values as bytes."""
    return {k: bytes(v) if isinstance(v, (bytes, memoryview)) else v
            for k, v in sample.items() if k not in ("__url__", "__local_path__")}


def read_all(path: Path) -> list[dict]:
    ds = TarShards([str(path)])
    return [bare(ds[i]) for i in range(len(ds))]


def stream_all(path: Path) -> list[dict]:
    return [bare(s) for s in TarShardStream([str(path)], shuffle_buffer=0)]


# name -> (members, the samples webdataset yields from them)
ODD_SHARDS: dict[str, tuple[list[tuple[str, bytes]], list[dict]]] = {
    "uppercase": ([("a.JPG", b"1"), ("a.CLS", b"2"), ("b.Jpg", b"3"), ("c.Seg.PNG", b"4")],
                  [{"__key__": "a", "jpg": b"1", "cls": b"2"}, {"__key__": "b", "jpg": b"3"},
                   {"__key__": "c", "seg.png": b"4"}]),
    "no_dot": ([("a.jpg", b"1"), ("README", b"x"), ("a.cls", b"2"), ("d/LICENSE", b"y")],
               [{"__key__": "a", "jpg": b"1", "cls": b"2"}]),
    "meta": ([("__meta__", b"m"), ("__x__/a.jpg", b"1"), ("__a.b__", b"n"), ("a.jpg", b"2"),
              ("__meta__.json", b"{}"), ("x/__y__/b.jpg", b"3")],
             [{"__key__": "a", "jpg": b"2"}, {"__key__": "__meta__", "json": b"{}"},
              {"__key__": "x/__y__/b", "jpg": b"3"}]),
    "hidden": ([(".jpg", b"0"), ("d.x/s1.seg.png", b"1"), ("d.x/s1.jpg", b"2"),
                ("d.x/.hid.jpg", b"3"), ("dx/.hid.jpg", b"4")],
               # base_plus_ext's regex: a dot-less directory becomes the key of a hidden file
               [{"__key__": "d.x/s1", "seg.png": b"1", "jpg": b"2"},
                {"__key__": "dx/", "hid.jpg": b"4"}]),
    "odd_but_kept": ([("a.", b"1"), ("b.jpg", b"2"), ("a.cls", b"3"), ("b.jpg", b"4")],
                     [{"__key__": "a", "": b"1"}, {"__key__": "b", "jpg": b"2"},
                      {"__key__": "a", "cls": b"3"}, {"__key__": "b", "jpg": b"4"}]),
}


@pytest.mark.parametrize("case", sorted(ODD_SHARDS))
def test_samples_are_the_ones_webdataset_makes(tmp_path: Path, case: str) -> None:
    members, samples = ODD_SHARDS[case]
    shard = write_tar(tmp_path / f"{case}.tar", members)
    assert read_all(shard) == samples
    assert stream_all(shard) == samples


@pytest.mark.parametrize("case", sorted(ODD_SHARDS))
def test_webdataset_reads_the_same_samples(tmp_path: Path, case: str) -> None:
    wds = pytest.importorskip("webdataset")
    members, samples = ODD_SHARDS[case]
    shard = write_tar(tmp_path / f"{case}.tar", members)
    theirs = [bare(s) for s in wds.WebDataset(str(shard), shardshuffle=False,
                                              empty_check=False)]
    assert theirs == samples == read_all(shard)


def test_split_name_keeps_webdatasets_key_and_lowercases_the_field() -> None:
    assert split_name("a/b.c/x.Seg.PNG") == ("a/b.c/x", "seg.png")
    assert split_name("plain") is None
    assert split_name("d/.hidden.jpg") == ("d/", "hidden.jpg")  # webdataset's regex, as is
    assert split_name("__shard_meta__/x.json") is None


def _duplicate(shard: Path, field: str) -> str:
    return (
        f"{shard}: sample 0 (key 'a') has the field {field!r} twice (a field is a member's "
        "extension, lowercased; __key__ and __url__ are the sample's own): webdataset refuses "
        "such a shard too (duplicate file name); give each member of a sample its own "
        "extension and re-create the shard"
    )


@pytest.mark.parametrize("members", [
    [("a.jpg", b"1"), ("a.jpg", b"2"), ("b.jpg", b"3")],
    [("a.jpg", b"1"), ("a.JPG", b"2")],
])
def test_two_members_of_one_field_are_refused_when_indexed(
    tmp_path: Path, members: list[tuple[str, bytes]]
) -> None:
    shard = write_tar(tmp_path / "dup.tar", members)
    for build in (lambda: TarShards([str(shard)]), lambda: index_shard(str(shard)),
                  lambda: list(TarShardStream([str(shard)]))):
        with pytest.raises(ShardError) as info:
            build()
        assert str(info.value) == _duplicate(shard, "jpg")
    assert not Path(index_path(str(shard))).exists()
    wds = pytest.importorskip("webdataset")
    with pytest.raises(ValueError, match="duplicate file name"):
        list(wds.WebDataset(str(shard), shardshuffle=False, empty_check=False))


def test_a_field_named_like_the_samples_key_is_refused(tmp_path: Path) -> None:
    shard = write_tar(tmp_path / "k.tar", [("a.jpg", b"1"), ("a.__key__", b"2")])
    with pytest.raises(ShardError) as info:
        TarShards([str(shard)])
    assert str(info.value) == _duplicate(shard, "__key__")


def old_index(shard: Path) -> ShardTable:
    """The index an earlier stoker wrote: the field's case kept, every member listed."""
    keys, starts, fields, offsets, sizes, crcs = [], [], [], [], [], []
    with tarfile.open(shard) as tar:
        for m in tar.getmembers():
            slash = m.name.rfind("/")
            dot = m.name.find(".", slash + 1)
            key, field = m.name[:dot], m.name[dot + 1 :]
            if not keys or keys[-1] != key:
                keys.append(key)
                starts.append(len(fields))
            data = tar.extractfile(m).read()  # type: ignore[union-attr]
            fields.append(field)
            offsets.append(m.offset_data)
            sizes.append(m.size)
            crcs.append(zlib.crc32(data))
    starts.append(len(fields))
    return ShardTable(shard.stat().st_size, np.array(keys), np.array(starts), np.array(fields),
                      np.array(offsets), np.array(sizes), np.array(crcs, dtype=np.uint32))


def _old_pack(directory: Path, shard: Path) -> ShardTable:
    table = old_index(shard)
    Path(index_path(str(shard))).write_bytes(table.to_bytes())
    data = tables_to_bytes([table])
    (directory / TABLES_NAME).write_bytes(data)
    (directory / "index.json").write_text(json.dumps({
        "format": "stoker-tar-shards", "version": 1, "tables": TABLES_NAME,
        "tables_bytes": len(data),
        "shards": [{"path": shard.name, "samples": len(table), "size_bytes": table.size_bytes}]}))
    return table


def test_an_older_index_with_uppercase_fields_reads_them_lowercased(tmp_path: Path) -> None:
    shard = write_tar(tmp_path / "up.tar", ODD_SHARDS["uppercase"][0])
    stored = _old_pack(tmp_path, shard)
    assert sorted(stored.fields.tolist()) == ["CLS", "JPG", "Jpg", "Seg.PNG"]
    samples = ODD_SHARDS["uppercase"][1]
    ds = TarShards(str(tmp_path))
    assert [bare(ds[i]) for i in range(len(ds))] == samples  # from the file of indexes
    assert read_all(shard) == samples  # from the sidecar
    assert [bare(s) for s in TarShardStream(str(tmp_path), shuffle_buffer=0)] == samples
    assert ds.locate(0).fields.keys() == {"jpg", "cls"}
    # What `stoker pack --verify` compares: a new scan equals the loaded older index.
    assert index_shard(str(shard)).same_as(ShardTable.from_bytes(stored.to_bytes(), "x"))
    lowered = tables_from_bytes(tables_to_bytes([stored]), "x")[0]
    assert lowered.fields.tolist() == ["jpg", "cls", "jpg", "seg.png"]
    plain = dataclasses.replace(stored, fields=np.array(["jpg", "cls", "jpg", "x"]))
    assert ShardTable.from_bytes(plain.to_bytes(), "x").fields.tolist() == ["jpg", "cls", "jpg",
                                                                            "x"]


def test_an_older_index_listing_one_field_twice_raises_when_read(tmp_path: Path) -> None:
    shard = write_tar(tmp_path / "dup.tar", [("a.jpg", b"1"), ("a.JPG", b"2"), ("b.jpg", b"3")])
    _old_pack(tmp_path, shard)
    for ds in (TarShards(str(tmp_path)), TarShards([str(shard)])):
        assert bare(ds[1]) == {"__key__": "b", "jpg": b"3"}
        with pytest.raises(ShardError) as info:
            ds[0]
        assert str(info.value) == _duplicate(shard, "jpg")
    with pytest.raises(ShardError) as info:
        list(TarShardStream(str(tmp_path), shuffle_buffer=0))
    assert str(info.value) == _duplicate(shard, "jpg")


def _sparse_message(shard: Path) -> str:
    return (
        f"{shard}: member 'a.bin' at its start is a sparse file (GNU tar --sparse): its bytes "
        "in the shard are not its data, which stoker reads by offset; re-create the shard "
        "without --sparse (-S)"
    )


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    # The header GNU tar --sparse writes in its default format (type "S"); a unit test starts
    # no `tar` process (/tmp/rev2/repro_sparse.sh did: the same error).
    shard = write_tar(tmp_path / "sparse.tar", [("a.bin", b"x" * 10)], fmt=tarfile.GNU_FORMAT,
                      kind=tarfile.GNUTYPE_SPARSE)
    with tarfile.open(shard) as tar:
        assert tar.getmembers()[0].issparse()
    for build in (lambda: TarShards([str(shard)]), lambda: index_shard(str(shard))):
        with pytest.raises(ShardError) as info:
            build()
        assert str(info.value) == _sparse_message(shard)


def _tar_bytes() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("a.jpg")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    return out.getvalue()


def _zip_bytes() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("a.jpg", b"1")
    return out.getvalue()


def _damaged_first_header() -> bytes:
    raw = bytearray(_tar_bytes())
    raw[2] ^= 1  # the name: the header's checksum no longer matches
    return bytes(raw)


@pytest.mark.parametrize(("name", "make", "what"), [
    ("s.tar.gz", lambda: gzip.compress(_tar_bytes()),
     "it is gzip-compressed; stoker reads uncompressed tar shards (a sample is one ranged "
     "read): decompress it (gzip -d) or re-create it uncompressed (stoker pack)"),
    ("s.tar", lambda: bz2.compress(_tar_bytes()),
     "it is bzip2-compressed; stoker reads uncompressed tar shards (a sample is one ranged "
     "read): decompress it (bzip2 -d) or re-create it uncompressed (stoker pack)"),
    ("s.tar", _zip_bytes, "it is a zip archive; re-create it as a tar (stoker pack)"),
    ("s.tar.idx.npz", _zip_bytes,
     "it is the index sidecar of {dir}/s.tar: pass that shard, the list of shards, or the "
     "pack's directory"),
    ("s.tar", lambda: b"",
     "the file is empty; re-create it (stoker pack redoes an unfinished shard)"),
    ("s.tar", _damaged_first_header,
     "its first header is not a valid tar header (bad checksum): the file is corrupted or "
     "not a tar; re-create it"),
])
def test_a_file_that_is_not_a_tar_shard_says_what_it_is(
    tmp_path: Path, name: str, make: object, what: str
) -> None:
    shard = tmp_path / name
    shard.write_bytes(make())  # type: ignore[operator]
    for build in (lambda: TarShards([str(shard)]), lambda: TarShards(str(shard)),
                  lambda: index_shard(str(shard)), lambda: list(TarShardStream(str(shard)))):
        with pytest.raises(ShardError) as info:
            build()
        assert str(info.value) == f"{shard}: not a tar shard: {what.format(dir=tmp_path)}"


def test_brace_patterns_expand_as_webdatasets_do() -> None:
    assert expand_braces("s3://b/s-{000000..000002}.tar") == [
        "s3://b/s-000000.tar", "s3://b/s-000001.tar", "s3://b/s-000002.tar"]
    assert expand_braces("{a,b}/s-{8..10}.tar") == [
        "a/s-8.tar", "a/s-9.tar", "a/s-10.tar", "b/s-8.tar", "b/s-9.tar", "b/s-10.tar"]
    assert expand_braces("{07..10}{,.x}")[:3] == ["07", "07.x", "08"]
    assert expand_braces("python{2.{5..6},3}") == ["python2.5", "python2.6", "python3"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("keep{x}.tar") == ["keep{x}.tar"]
    with pytest.raises(ValueError) as info:
        expand_braces("s-{000..009.tar")
    assert str(info.value) == (
        "'s-{000..009.tar': unbalanced braces in the shard pattern; give a list of paths or a "
        "pattern such as 'shards/s-{000000..000099}.tar'")
    with pytest.raises(ValueError) as info:
        expand_braces("s-{a..c}.tar")
    assert str(info.value) == (
        "'s-{a..c}.tar': {a..c} is not a range stoker expands (integers, as in "
        "{000000..000099}); give a list of paths instead")


def test_brace_expansion_agrees_with_braceexpand() -> None:
    braceexpand = pytest.importorskip("braceexpand")
    for pattern in ["s-{000000..000099}.tar", "{07..10}", "{4..1}", "{2..-1}", "{-01..2}",
                    "{0..03}", "{-0..2}", "python{2.{5..7},3.{2,3}}", "index.html{,.backup}",
                    "a{b,c}d{1..2}", "{x}", "a{b}c{1,2}", "{a,{b,c}}", "{}", "x{,}y",
                    "{a{1..2}}", "{foo..bar}", "plain.tar"]:
        assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern)), pattern


def test_a_shard_pattern_opens_its_shards(tmp_path: Path) -> None:
    for i in range(3):
        write_tar(tmp_path / f"s-{i:06d}.tar", [(f"k{i}.jpg", bytes([i]))])
    pattern = str(tmp_path / "s-{000000..000002}.tar")
    ds = TarShards(pattern)
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["k0", "k1", "k2"]
    assert ds[2]["__url__"] == str(tmp_path / "s-000002.tar")
    assert sorted(s["__key__"] for s in TarShardStream(pattern)) == ["k0", "k1", "k2"]


def test_a_directory_without_a_manifest_says_what_to_pass(tmp_path: Path) -> None:
    write_tar(tmp_path / "s-000000.tar", [("k.jpg", b"1")])
    for build in (lambda: TarShards(str(tmp_path)), lambda: TarShardStream(str(tmp_path))):
        with pytest.raises(FileNotFoundError) as info:
            build()
        assert str(info.value) == (
            f"{tmp_path}/index.json: no such file: a directory of shards is opened through the "
            "index.json `stoker pack` writes in it. For tar shards without one, pass the list "
            "of their paths (or a pattern such as 'shards/s-{000000..000099}.tar'), or pack "
            "them with `stoker pack`")


def test_a_mistyped_pack_directory_is_said_not_to_exist(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    for reader in (TarShards, TarShardStream):
        for given, near in ((tmp_path / "shard", " (did you mean " f"{tmp_path / 'shards'}?)"),
                            (tmp_path / "nothing" / "like", "")):
            with pytest.raises(FileNotFoundError) as info:
                reader(str(given))
            assert str(info.value) == (
                f"{given}: no such directory{near}. A pack is the directory `stoker pack` "
                "wrote (holding index.json and its .tar shards)")


def test_a_missing_folder_to_pack_is_said_not_to_exist(tmp_path: Path) -> None:
    from stoker.formats import pack

    (tmp_path / "file.txt").write_text("x")
    for given, what in ((tmp_path / "img", "no such directory"),
                        (tmp_path / "file.txt", "not a directory")):
        with pytest.raises(FileNotFoundError) as info:
            pack(str(given), str(tmp_path / "out"))
        assert str(info.value) == (f"{given}: {what}; stoker pack reads an image folder (one "
                                   "subdirectory per class) or a map-style Dataset")


def test_a_file_given_as_a_pack_is_named_with_what_a_pack_is(tmp_path: Path) -> None:
    photo = tmp_path / "0000.jpg"
    photo.write_bytes(b"\xff\xd8 not a pack")
    for given in (str(photo), f"{photo}/"):
        for reader in (TarShards, TarShardStream):
            with pytest.raises(NotADirectoryError) as info:
                reader(given)
            assert str(info.value) == (
                f"{photo} is a file, not a pack of shards. A pack is a directory written by "
                "`stoker pack`, holding index.json and the .tar shards it lists: pass that "
                "directory or its index.json; for tar shards without one, pass a .tar path, a "
                "list of them, or a pattern such as 'shards/s-{000000..000099}.tar'")


@pytest.mark.parametrize("empty", [[], ()], ids=["list", "tuple"])
def test_no_shards_at_all_are_refused(empty: list) -> None:
    with pytest.raises(ValueError) as info:
        TarShards(empty)
    assert str(info.value) == (
        f"TarShards({empty!r}): no shards given. Pass a pack (the directory `stoker pack` "
        "wrote, or its index.json), a .tar path, a list of them, or a pattern such as "
        "'shards/s-{000000..000099}.tar'")
    with pytest.raises(ValueError) as stream:
        TarShardStream(empty)
    assert str(stream.value) == "no shards given: pass a list of .tar paths or URLs"


def test_a_truncated_shard_with_a_sidecar_is_refused_at_open(tmp_path: Path) -> None:
    shard = write_tar(tmp_path / "s.tar", [("a.jpg", b"1" * 3000), ("b.jpg", b"2" * 3000)])
    table = index_shard(str(shard))
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(ShardError) as info:
        TarShards([str(shard)])
    assert str(info.value) == (
        f"{shard}: the shard is {size - 1000} bytes and its index has 2 samples; the index says "
        f"{table.size_bytes} bytes: the shard changed or was truncated after it was indexed; "
        "re-create it (stoker pack redoes an unfinished shard)")
