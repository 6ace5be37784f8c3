"""The index of one tar shard: where each sample's members lie, found by scanning the tar with
the standard library's ``tarfile`` (never by a parser of our own).

A sample is a run of consecutive members sharing a key, WebDataset's rule: a member named
``dir/name.EXT.gz`` has key ``dir/name`` and field ``ext.gz`` (the split is at the first dot
of the file name, the field lowercased), and the members WebDataset skips are skipped
(``tar_members``). Per member the index keeps the data's byte offset in the tar, its size and
its CRC-32, so a reader fetches a sample with one ranged read (its members are adjacent) and
knows when the bytes it got are not the ones indexed.

Sidecar: ``<shard>.idx.npz`` beside the shard, plain numpy arrays (no pickles), loaded with
``numpy.load`` from bytes, so it travels through any ``ByteSource``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import mmap
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from stoker.errors import ShardError
from stoker.formats._common import ViewFile, default_source, write_atomic
from stoker.formats.checksum import crc32
from stoker.formats.tar_members import (
    RESERVED,
    duplicate_field,
    lowercase_fields,
    not_a_tar,
    split_name,
)
from stoker.storage import ByteSource
from stoker.storage.source import ByteSourceExtras, extra

INDEX_SUFFIX = ".idx.npz"
INDEX_VERSION = 1
TABLES_NAME = "index.tables.npz"  # every shard's index in one file, beside the manifest
_COLUMNS = ("keys", "fields", "offsets", "sizes", "crc32")


# NOTE [ Index columns per process ]
# Python lists of a table cost ~280 bytes a sample (an int object per offset, size and CRC, a
# str per key and field) in every process that builds them: kept for every shard, 1M samples
# came to ~280 MB per worker. A random read therefore indexes memoryviews of the numpy
# arrays (~35 ns an item, no copy: arrays loaded before the workers fork stay shared pages)
# and converts the one key it returns; fields are codes into the shard's few field names.
# A shard read front to back (TarShardStream) builds lists for it and drops them after.


def _view(array: np.ndarray, dtype: Any) -> memoryview:
    """Items as Python ints, ~35 ns each; no copy when the array already is ``dtype``."""
    return np.ascontiguousarray(array, dtype).data


class _Strings:
    """``column[i]`` as a plain ``str``, from a numpy string array."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __getitem__(self, i: int) -> str:
        return str(self._array[i])


class _Coded:
    """``column[i]`` as one of a few strings, from a code per item."""

    __slots__ = ("_names", "_codes")

    def __init__(self, names: tuple[str, ...], codes: memoryview) -> None:
        self._names, self._codes = names, codes

    def __getitem__(self, i: int) -> str:
        return self._names[self._codes[i]]


class IndexColumns(NamedTuple):
    starts: memoryview
    keys: _Strings
    fields: _Coded
    offsets: memoryview
    sizes: memoryview
    crc32: memoryview


@dataclass(frozen=True, eq=False)
class ShardTable:
    """Samples of one shard. Sample ``j`` owns members ``starts[j]:starts[j + 1]``."""

    size_bytes: int
    keys: np.ndarray  # str, one per sample
    starts: np.ndarray  # int64, samples + 1
    fields: np.ndarray  # str, one per member
    offsets: np.ndarray  # int64, data offset of each member in the tar
    sizes: np.ndarray  # int64
    crc32: np.ndarray  # uint32
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)

    def members(self, j: int) -> range:
        return range(int(self.starts[j]), int(self.starts[j + 1]))

    def as_lists(self) -> tuple[list[Any], ...]:
        """The arrays as Python lists (starts, keys, fields, offsets, sizes, crc32), for
        reading the whole shard once: the cheapest to index (~15 ns an item), but ~280 bytes
        a sample, so not kept (NOTE [ Index columns per process ])."""
        return tuple(a.tolist() for a in (self.starts, self.keys, self.fields, self.offsets,
                                          self.sizes, self.crc32))

    @functools.cached_property
    def columns(self) -> IndexColumns:
        """The same six columns for reading a sample here and there: views of the arrays
        (NOTE [ Index columns per process ])."""
        names, codes = np.unique(self.fields, return_inverse=True)
        return IndexColumns(
            _view(self.starts, np.int64), _Strings(self.keys),
            _Coded(tuple(str(n) for n in names), _view(codes, np.int32)),
            _view(self.offsets, np.int64), _view(self.sizes, np.int64),
            _view(self.crc32, np.uint32))

    def span(self, j: int) -> tuple[int, int]:
        """(offset, length) of the bytes holding every member of sample ``j``."""
        members = self.members(j)
        if not members:
            return 0, 0
        first, last = members[0], members[-1]
        start = int(self.offsets[first])
        return start, int(self.offsets[last] + self.sizes[last]) - start

    def same_as(self, other: ShardTable) -> bool:
        return self.size_bytes == other.size_bytes and all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in ("keys", "starts", "fields", "offsets", "sizes", "crc32")
        )

    def digest(self) -> str:
        """A tag of the shard's content: its size and every member's offset, size and CRC-32
        (NOTE [ Cached copies named by their content ] in ``storage/cache.py``)."""
        h = hashlib.blake2b(np.int64(self.size_bytes).tobytes(), digest_size=12)
        for column, dtype in ((self.offsets, np.int64), (self.sizes, np.int64),
                              (self.crc32, np.uint32)):
            h.update(np.ascontiguousarray(column, dtype=dtype).data)
        return h.hexdigest()

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        np.savez(
            out, version=np.int64(INDEX_VERSION), size_bytes=np.int64(self.size_bytes),
            keys=self.keys, starts=self.starts, fields=self.fields, offsets=self.offsets,
            sizes=self.sizes, crc32=self.crc32, meta=np.str_(json.dumps(self.meta)),
        )
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> ShardTable:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                if int(z["version"]) != INDEX_VERSION:
                    raise ValueError(f"index version {int(z['version'])}")
                return cls(
                    int(z["size_bytes"]), z["keys"], z["starts"], lowercase_fields(z["fields"]),
                    z["offsets"], z["sizes"], z["crc32"], json.loads(str(z["meta"])),
                )
        except Exception as exc:
            raise ShardError(
                f"{where}: not a stoker shard index ({type(exc).__name__}: {exc}); expected "
                f"the {INDEX_SUFFIX} file `stoker pack` writes: delete it and rebuild it with "
                "stoker.formats.index_shard"
            ) from exc


def check_crc(value: bytes, expected: int, path: str, key: str, field: str,
              sample: int | None = None) -> None:
    """Raise if a member's bytes are not the ones indexed (``sample``: its index, if any)."""
    actual = crc32(value)
    if actual != expected:
        which = f"key {key!r}" if sample is None else f"sample {sample} (key {key!r})"
        raise ShardError(
            f"{path}: {which}, member {key}.{field}: CRC-32 {actual:08x}, the index says "
            f"{expected:08x}: the shard was corrupted or changed after it was indexed; "
            "re-create it"
        )


def tables_to_bytes(tables: list[ShardTable]) -> bytes:
    """Many shards' indexes as one file (the sidecars' arrays, concatenated in shard order),
    so a dataset of many remote shards learns every index with one read."""
    arrays: dict[str, Any] = {c: _concat([getattr(t, c) for t in tables]) for c in _COLUMNS}
    arrays |= {
        "version": np.int64(INDEX_VERSION),
        "size_bytes": np.array([t.size_bytes for t in tables], dtype=np.int64),
        "samples": np.array([len(t) for t in tables], dtype=np.int64),
        "members": np.array([len(t.fields) for t in tables], dtype=np.int64),
        "starts": _concat([t.starts for t in tables]),
        "meta": np.str_(json.dumps([t.meta for t in tables])),
    }
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def tables_from_bytes(data: bytes, where: str) -> list[ShardTable]:
    """The shards' indexes from ``tables_to_bytes``; each table's arrays are views of the
    file's (no copy)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if int(z["version"]) != INDEX_VERSION:
                raise ValueError(f"index version {int(z['version'])}")
            arrays = {name: z[name] for name in ("starts", *_COLUMNS)}
            arrays["fields"] = lowercase_fields(arrays["fields"])
            samples, members = z["samples"].tolist(), z["members"].tolist()
            size_bytes, metas = z["size_bytes"].tolist(), json.loads(str(z["meta"]))
        if not len(samples) == len(members) == len(size_bytes) == len(metas):
            raise ValueError("per-shard arrays of different lengths")
        tables, sample0, member0 = [], 0, 0
        for k, (n, m) in enumerate(zip(samples, members, strict=True)):
            starts = arrays["starts"][sample0 + k : sample0 + k + n + 1]
            cut = {c: arrays[c][member0 : member0 + m] for c in ("fields", "offsets", "sizes",
                                                                    "crc32")}
            tables.append(ShardTable(
                size_bytes[k], arrays["keys"][sample0 : sample0 + n], starts, cut["fields"],
                cut["offsets"], cut["sizes"], cut["crc32"], metas[k]))
            sample0, member0 = sample0 + n, member0 + m
        if sample0 != len(arrays["keys"]) or member0 != len(arrays["fields"]):
            raise ValueError("the per-shard counts do not add up to the arrays' lengths")
        return tables
    except Exception as exc:
        raise ShardError(
            f"{where}: not a stoker index of shards ({type(exc).__name__}: {exc}); expected "
            f"the {TABLES_NAME} `stoker pack` writes: delete it (the shards' own "
            f"{INDEX_SUFFIX} files are read instead) or pack again"
        ) from exc


def scan_shard(source: ByteSource, path: str, meta: dict[str, Any] | None = None) -> ShardTable:
    """Index a tar shard by reading it through: every member's offset, size and CRC-32."""
    with shard_bytes(source, path) as view:
        return scan_bytes(view, path, meta)


@contextlib.contextmanager
def shard_bytes(source: ByteSource, path: str) -> Iterator[memoryview]:
    """The whole shard: a read-only map of the local file (or of a remote source's cached
    copy, fetched first), or its bytes read through."""
    fetch_local = extra(source, ByteSourceExtras.fetch_local)
    local = fetch_local(path) if fetch_local is not None else source.local_path(path)
    try:
        f = open(local, "rb") if local is not None else None
    except FileNotFoundError:  # evicted meanwhile: read it through
        f = None
    if f is None:
        yield memoryview(source.read(path))
        return
    with f:
        if f.seek(0, io.SEEK_END) == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                yield view
            finally:
                view.release()


def scan_bytes(view: memoryview, path: str, meta: dict[str, Any] | None = None) -> ShardTable:
    """Index a whole shard held in memory (``path`` only names it in errors)."""
    keys: list[str] = []
    starts: list[int] = []
    fields: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    crcs: list[int] = []
    for key, members in scan_samples(ViewFile(view), len(view), path):
        keys.append(key)
        starts.append(len(fields))
        for ext, offset, length in members:
            fields.append(ext)
            offsets.append(offset)
            sizes.append(length)
            crcs.append(crc32(view[offset : offset + length]))
    starts.append(len(fields))
    return ShardTable(
        len(view), np.array(keys, dtype=str), np.array(starts, dtype=np.int64),
        np.array(fields, dtype=str), np.array(offsets, dtype=np.int64),
        np.array(sizes, dtype=np.int64), np.array(crcs, dtype=np.uint32), dict(meta or {}),
    )


def scan_samples(fileobj: Any, size: int, path: str) -> Iterator[tuple[str, list[Member]]]:
    """The samples of a tar shard of ``size`` bytes read through ``fileobj`` (seekable), in
    order, by WebDataset's rules: each sample's key and its members (field, offset of the
    data, length), given once the header after its last member (or the end-of-archive
    marker) has been read. A shard read as it arrives has a sample's bytes by then (NOTE
    [ A bare shard read as it arrives ] in ``tar_arriving.py``). A damaged shard raises where
    the damage is, after the samples before it."""
    keys: list[str] = []
    members: list[Member] = []
    seen: set[str] = set()  # the current sample's fields, and the names its dict has
    fileobj.seek(0)
    with _open_tar(fileobj, path) as tar:
        for member, key, ext in _members(tar, path, keys):
            if not keys or keys[-1] != key:
                if members:
                    yield keys[-1], members
                keys.append(key)
                members, seen = [], set(RESERVED)
            if ext in seen:
                raise duplicate_field(path, len(keys) - 1, key, ext)
            seen.add(ext)
            end = member.offset_data + member.size
            if end > size:
                raise ShardError(_truncated(path, len(keys) - 1, key, end, size))
            members.append(Member(ext, member.offset_data, member.size))
        _check_end(fileobj, tar.offset, size, path, keys)
    if members:
        yield keys[-1], members


class Member(NamedTuple):
    """A sample's member in a tar shard: its field and where its data is."""

    field: str
    offset: int
    length: int


def _open_tar(fileobj: Any, path: str) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=fileobj, mode="r:")
    except tarfile.TarError as exc:
        fileobj.seek(0)
        raise not_a_tar(path, bytes(fileobj.read(6)), exc) from exc


def _members(tar: tarfile.TarFile, path: str, keys: list[str]) -> Any:
    """(member, key, field) of the regular-file members WebDataset makes samples of, in order;
    a damaged header or a sparse member is an error naming where it was."""
    while True:
        try:
            member = tar.next()
        except tarfile.TarError as exc:
            raise ShardError(
                f"{path}: not a readable tar shard: {exc} {_after(keys)}; the file is truncated "
                "or corrupted: re-create it (stoker pack redoes an unfinished shard)"
            ) from exc
        if member is None:
            return
        named = split_name(member.name) if member.isfile() else None
        if named is None:
            continue
        if member.issparse():  # its bytes in the tar are the file's data runs, not the file
            raise ShardError(
                f"{path}: member {member.name!r} {_after(keys)} is a sparse file (GNU tar "
                "--sparse): its bytes in the shard are not its data, which stoker reads by "
                "offset; re-create the shard without --sparse (-S)"
            )
        yield (member, *named)


def _after(keys: list[str]) -> str:
    return f"after sample {len(keys) - 1} (key {keys[-1]!r})" if keys else "at its start"


def _check_end(fileobj: Any, offset: int, size: int, path: str, keys: list[str]) -> None:
    """tarfile ends quietly at a header cut short; the end-of-archive marker (two zero
    blocks every tar writer appends) tells a complete shard from one cut at a member."""
    fileobj.seek(offset)
    marker = bytes(fileobj.read(2 * tarfile.BLOCKSIZE))
    if len(marker) < 2 * tarfile.BLOCKSIZE or any(marker):
        raise ShardError(
            f"{path}: truncated or corrupted tar shard: neither a valid member header nor the "
            f"end-of-archive marker at byte {offset}, {_after(keys)} (the file has {size} "
            "bytes); re-create it (stoker pack redoes an unfinished shard)"
        )


def _truncated(path: str, sample: int, key: str, end: int, size: int) -> str:
    return (
        f"{path}: truncated tar shard: sample {sample} (key {key!r}) ends at byte {end}, the "
        f"file has {size} bytes; re-create it (stoker pack redoes an unfinished shard)"
    )


def index_path(shard: str) -> str:
    return shard + INDEX_SUFFIX


def load_index(source: ByteSource, shard: str) -> ShardTable:
    """The shard's sidecar index."""
    where = index_path(shard)
    return ShardTable.from_bytes(read_fresh(source, where), where)


# NOTE [ A pack written again at the same place ]
# A remote source's cache keeps whole objects by URL, and `stoker pack` may write a new pack
# where an old one was (fixed data, the same prefix). The manifest and the indexes are read
# from the store every time a dataset is opened, never from the cache (small, once each),
# so they are the new pack's; a cached shard of another size than the manifest says is
# dropped when opened (``Prefetcher._pin_cached`` in storage/prefetch.py); and a sample whose CRC
# is not its index's, read from a cached copy, drops that copy and is read once more from the
# store: a copy of the old pack is replaced, while a shard that is itself wrong still raises.
# Before, the old copies were read and the CRC errors told users to pack again. And a shard
# whose index is known when the dataset opens is cached under a digest of that index (NOTE
# [ Cached copies named by their content ] in storage/cache.py), so an old copy of the same
# size is not even found, CRCs checked or not. Not caught: a pack of the same shard sizes
# whose indexes are read only later (over 256 MiB of them remotely), read with
# verify_crc=False, and a bare shard list without sidecar indexes (its index is scanned from
# the cached copy).


def read_fresh(source: ByteSource, path: str) -> bytes:
    """The whole object from its store, never from a cache of remote objects (NOTE [ A pack
    written again at the same place ])."""
    get_whole = extra(source, ByteSourceExtras.get_whole)
    return source.read(path) if get_whole is None else get_whole(path)


def drop_stale_copy(source: ByteSource, path: str) -> bool:
    """Drop the cached copy of ``path`` this process read from, after its bytes disagreed
    with the index: True when there was one (read again: from the store), False when the
    bytes came from the store itself (NOTE [ A pack written again at the same place ])."""
    drop = extra(source, ByteSourceExtras.drop_cached)
    return bool(drop(path)) if drop is not None else False


def index_shard(shard: str, source: ByteSource | None = None) -> ShardTable:
    """Scan a local tar shard (e.g. plain WebDataset shards from elsewhere) and write its
    sidecar index beside it, atomically; returns the index."""

    table = scan_shard(default_source(shard, source), shard)
    write_atomic(index_path(shard), table.to_bytes())
    return table
