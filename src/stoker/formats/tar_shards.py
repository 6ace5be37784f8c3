"""``TarShards``: WebDataset-style tar shards as a map-style dataset.

Random access comes from the index (``tar_index``): sample ``i`` is found by a binary search
over the shards' sample counts, then read with one ranged read of its adjacent members. Being
map-style, the dataset gets everything stoker's loader gives map-style datasets: a true
shuffle over all samples, O(1) exact resume, rank x worker sharding with equal steps per rank.

A dataset is opened from its manifest (``index.json``, written by ``stoker pack``: shard
paths, sample counts and byte sizes, so opening a remote dataset costs one read however many
shards there are; a remote shard's sidecar index is read the first time one of its samples is,
local ones at open, so forked workers inherit them) or from a list of
shard paths (each shard's sidecar is read, or, for plain WebDataset shards without one, the
shard is scanned at open: every byte read once; ``stoker.formats.index_shard`` saves that scan).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import posixpath
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from stoker.errors import ShardError
from stoker.formats._common import default_source, expand_braces, join, parent
from stoker.formats.cache_thrash import ThrashWatch
from stoker.formats.checksum import crc32
from stoker.formats.tar_index import (
    TABLES_NAME,
    ShardTable,
    check_crc,
    drop_stale_copy,
    load_index,
    read_fresh,
    scan_shard,
    tables_from_bytes,
)
from stoker.formats.tar_members import duplicate_field
from stoker.storage import ByteSource

_INDEX_THREADS = 8  # remote indexes read at once (NOTE [ A batch's shards at once ])
_EAGER_REMOTE_INDEXES = 256  # up to this many shards, remote indexes are read at construction
_EAGER_TABLES_BYTES = 256 << 20  # a remote index file up to this size is read at construction
_GUESSED_TABLES_BYTES = 8 << 20  # NOTE [ The file of indexes alongside the manifest ]

MANIFEST_NAME = "index.json"
MANIFEST_FORMAT = "stoker-tar-shards"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class TarShard:
    """One shard of a dataset: where it is, how many samples it holds, its size in bytes."""

    path: str
    samples: int
    size_bytes: int


@dataclass(frozen=True)
class SampleLocation:
    """Where sample bytes lie: its shard, the byte range of all its members (one ranged read),
    and each field's own (offset, size) in the shard."""

    shard: str
    key: str
    offset: int
    length: int
    fields: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class Manifest:
    """What ``index.json`` says: the shards, the pack's metadata, and the file holding every
    shard's index (``tables``, None for manifests written before it existed) and its size."""

    shards: list[TarShard]
    meta: dict[str, Any]
    tables: str | None = None
    tables_bytes: int = 0
    tables_data: bytes | None = field(default=None, repr=False)  # read alongside, if it was


# NOTE [ The file of indexes alongside the manifest ]
# Opening a remote pack took two round trips one after the other: the manifest, then the file
# of indexes it names. `stoker pack` always writes that file as TABLES_NAME beside the manifest,
# so from object storage its first _GUESSED_TABLES_BYTES are asked for at the same time and
# kept when the manifest names that file at that size (packs of up to ~40,000 samples at ~200
# bytes a sample); otherwise they are dropped and the file is read as before. A pack whose
# index file is larger pays one ranged GET it did not need.


def read_manifest(source: ByteSource, path: str) -> Manifest:
    """The manifest at ``path`` (NOTE [ The file of indexes alongside the manifest ])."""
    read_prefix = getattr(source, "read_prefix", None)
    if read_prefix is None:
        return _parse_manifest(_read_manifest_file(source, path), path)
    guess = join(parent(path), TABLES_NAME)
    with ThreadPoolExecutor(1) as pool:
        tables = pool.submit(read_prefix, guess, _GUESSED_TABLES_BYTES)
        manifest = _parse_manifest(_read_manifest_file(source, path), path)
        try:
            data = tables.result()
        except Exception:  # none there (a pack from before it), or failing: read when needed
            return manifest
    if manifest.tables == guess and len(data) == manifest.tables_bytes:
        return dataclasses.replace(manifest, tables_data=data)
    return manifest


def _read_manifest_file(source: ByteSource, path: str) -> bytes:
    try:
        return read_fresh(source, path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{path}: no such file: a directory of shards is opened through the {MANIFEST_NAME} "
            "`stoker pack` writes in it. For tar shards without one, pass the list of their "
            "paths (or a pattern such as 'shards/s-{000000..000099}.tar'), or pack them with "
            "`stoker pack`"
        ) from exc


def _parse_manifest(raw: bytes, path: str) -> Manifest:
    try:
        manifest = json.loads(raw)
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format is {manifest.get('format')!r}")
        base = parent(path)
        shards = [
            TarShard(join(base, s["path"]), int(s["samples"]), int(s["size_bytes"]))
            for s in manifest["shards"]
        ]
        tables = manifest.get("tables")
        return Manifest(shards, dict(manifest.get("meta", {})),
                        join(base, tables) if tables else None,
                        int(manifest.get("tables_bytes", 0)))
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(
            f"{path}: not a stoker shard manifest ({type(exc).__name__}: {exc}); expected the "
            f"{MANIFEST_NAME} that `stoker pack` writes, or pass the list of shard paths instead"
        ) from exc


def read_tables(source: ByteSource, manifest: Manifest) -> list[ShardTable]:
    """Every shard's index from the manifest's file of them, one per listed shard."""
    assert manifest.tables is not None
    data = manifest.tables_data
    tables = tables_from_bytes(read_fresh(source, manifest.tables) if data is None else data,
                               manifest.tables)
    if len(tables) != len(manifest.shards):
        raise ShardError(
            f"{manifest.tables}: indexes of {len(tables)} shards, the manifest lists "
            f"{len(manifest.shards)}: the two were not written by the same pack; pack again")
    return tables


def size_mismatch(path: str, actual: int, table: ShardTable,
                  samples: int | None = None) -> ShardError:
    """The error for a shard whose size (or sample count) is not what its index says."""
    listed = "" if samples is None else f" and the manifest {samples} samples"
    return ShardError(
        f"{path}: the shard is {actual} bytes and its index has {len(table)} samples; the "
        f"index says {table.size_bytes} bytes{listed}: the shard changed or was truncated "
        "after it was indexed; re-create it (stoker pack redoes an unfinished shard)"
    )


def expect_contents(source: ByteSource, tables: dict[str, ShardTable]) -> None:
    """Tell a caching source what each shard's content is (a digest of its index), so no
    cached copy of other content is read for it (NOTE [ Cached copies named by their
    content ] in ``storage/cache.py``)."""
    expect_versions = getattr(source, "expect_versions", None)
    if expect_versions is not None and tables:
        expect_versions({path: table.digest() for path, table in tables.items()})


def expect_manifest_sizes(source: ByteSource, shards: list[TarShard]) -> None:
    """Tell a source that takes them the shards' sizes the manifest gives, so no request asks
    them one by one (``RemoteSource.expect_sizes``)."""
    expect_sizes = getattr(source, "expect_sizes", None)
    if expect_sizes is not None:
        expect_sizes({s.path: s.size_bytes for s in shards})


def manifest_path(path: str) -> str | None:
    """The manifest a path names (itself, or ``index.json`` in it), or None for one shard."""
    if path.endswith(".json"):
        return path
    if path.endswith((".tar", ".tgz")) or ".tar." in posixpath.basename(path):
        return None  # a shard, compressed ones included: the scan says what they are
    return posixpath.join(path.rstrip("/"), MANIFEST_NAME)


class TarShards(Dataset[Any]):
    """Samples of tar shards, by index. Sample ``i`` is a dict: ``"__key__"`` (the members'
    shared name), ``"__url__"`` (the shard) and one ``bytes`` value per member, keyed by its
    extension (``"jpg"``, ``"cls"``, ...), as WebDataset yields them; ``transform``, if given,
    is applied to that dict.

    ``path``: a manifest (``.../index.json``), the directory holding one, a shard (``.tar``),
    a list of shards, or a pattern of them (``"s3://b/s-{000000..000099}.tar"``, expanded as
    WebDataset expands it). ``source``: the ``ByteSource`` bytes are read through (default: local
    files, or the object store a URL names). ``verify_crc``: check each member's CRC-32 against
    the index on every read (about 40 us per 100 KB), so a shard changed after its index was
    built raises ``ShardError`` instead of yielding wrong bytes.
    """

    def __init__(
        self,
        path: str | Sequence[str],
        *,
        source: ByteSource | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        verify_crc: bool = True,
    ) -> None:
        if isinstance(path, str) and "{" in path and (expanded := expand_braces(path)) != [path]:
            path = expanded
        first = path if isinstance(path, str) else (path[0] if path else "")
        self.source = default_source(first, source)
        self.transform = transform
        self.verify_crc = verify_crc
        self.meta: dict[str, Any] = {}
        self._tables: dict[int, ShardTable] = {}
        self._thrash: ThrashWatch | None = None  # the main process's, made on first use
        manifest = manifest_path(path) if isinstance(path, str) else None
        scanned: set[int] = set()  # shards indexed from their own (maybe cached) bytes: no tag
        if manifest is not None:
            self._open_manifest(read_manifest(self.source, manifest))
        else:
            paths = [path] if isinstance(path, str) else list(path)
            self.shards = [self._open_unlisted(s, p, scanned) for s, p in enumerate(paths)]
            self._lazy = self._remote = False
        expect_contents(self.source, {self.shards[s].path: table for s, table
                                      in self._tables.items() if s not in scanned})
        self._ends = np.cumsum([s.samples for s in self.shards], dtype=np.int64).tolist()
        self._length = self._ends[-1] if self._ends else 0

    def _open_manifest(self, manifest: Manifest) -> None:
        # Indexes are read now when that is cheap: forked workers inherit them, so they are
        # not re-read by every worker of every epoch (NOTE [ A batch's shards at once ]).
        self.shards, self.meta = manifest.shards, manifest.meta
        paths = [s.path for s in self.shards]
        # A warm cache holds local copies of a remote pack: it is still read as remote (sizes
        # from the manifest, the main process fetching for its workers), else each shard's
        # size was asked of the store on opening, one request at a time.
        self._remote = bool(paths) and (hasattr(self.source, "expect_sizes")
                                        or self.source.local_path(paths[0]) is None)
        if self._remote:
            expect_manifest_sizes(self.source, self.shards)
        if manifest.tables is not None and (
                not self._remote or manifest.tables_bytes <= _EAGER_TABLES_BYTES):
            tables = read_tables(self.source, manifest)
            for shard, table in zip(self.shards, tables, strict=True):
                self._check(shard, table)
            self._tables = dict(enumerate(tables))
            self._lazy = False
            return
        self._lazy = self._remote and len(self.shards) > _EAGER_REMOTE_INDEXES
        if not self._remote:  # local sidecars: ~1 ms each
            for s in range(len(self.shards)):
                self.table(s)
        elif not self._lazy:  # remote ones side by side, while there are few
            self._load_tables(list(range(len(self.shards))))

    def _open_unlisted(self, s: int, path: str, scanned: set[int]) -> TarShard:
        try:
            table = load_index(self.source, path)
        except FileNotFoundError:
            table = scan_shard(self.source, path)  # plain WebDataset shard: read it through once
            scanned.add(s)
        else:
            self._check_size(path, table)
        self._tables[s] = table
        return TarShard(path, len(table), table.size_bytes)

    def __len__(self) -> int:
        return self._length

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_thrash"] = None  # the main process's alone
        if self._lazy:  # workers re-read the sidecars they need: smaller pickles under spawn
            state["_tables"] = {}
        return state

    def _position(self, index: int) -> tuple[int, int]:
        n = self._length
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        index %= n
        s = bisect.bisect_right(self._ends, index)
        return s, index - (self._ends[s - 1] if s else 0)

    def table(self, s: int) -> ShardTable:
        """Shard ``s``'s index (read on first use, checked against the shard's size)."""
        table = self._tables.get(s)
        if table is None:
            table = self._tables[s] = self._load_table(s)
        return table

    def _load_tables(self, shard_ids: list[int]) -> None:
        with ThreadPoolExecutor(min(len(shard_ids), _INDEX_THREADS)) as pool:
            tables = list(pool.map(self._load_table, shard_ids))
        self._tables.update(zip(shard_ids, tables, strict=True))

    def _load_table(self, s: int) -> ShardTable:
        shard = self.shards[s]
        table = load_index(self.source, shard.path)
        self._check(shard, table)
        return table

    def _check_size(self, path: str, table: ShardTable) -> None:
        """A shard against its sidecar's size where that costs no request: a local file's (one
        stat), or one a remote source already knows (listed or read)."""
        known_size = getattr(self.source, "known_size", None)
        if known_size is not None:
            actual = known_size(path)
        else:
            actual = self.source.size(path) if self.source.local_path(path) else None
        if actual is not None and actual != table.size_bytes:
            raise size_mismatch(path, actual, table)

    def _check(self, shard: TarShard, table: ShardTable) -> None:
        actual = self.source.size(shard.path)
        if actual != table.size_bytes or len(table) != shard.samples:
            raise size_mismatch(shard.path, actual, table, shard.samples)

    def locate(self, index: int) -> SampleLocation:
        """Where sample ``index`` lies (for fetching ahead or by range), without reading it."""
        s, j = self._position(index)
        table = self.table(s)
        offset, length = table.span(j)
        fields = {
            str(table.fields[m]): (int(table.offsets[m]), int(table.sizes[m]))
            for m in table.members(j)
        }
        return SampleLocation(self.shards[s].path, str(table.keys[j]), offset, length, fields)

    def __getitem__(self, index: int) -> Any:
        sample = self.read(index)
        return sample if self.transform is None else self.transform(sample)

    def stoker_prepare_batch(self, indices: list[int]) -> None:
        """Called by stoker's loader with a batch's indices before its samples are read:
        from object storage, the indexes and shards the batch needs that are not here yet are
        fetched side by side (NOTE [ A batch's shards at once ]). The samples are the same
        without it (torch's DataLoader does not call it)."""
        if self._remote:
            try:
                self._warm(self._shard_ids(indices))
            except Exception:  # the sample that needs it reads it again and reports
                pass

    def stoker_fetch_for_batch(self, indices: list[int]) -> None:
        """Called by stoker's loader in its main process with each batch's indices as it
        sends the batch to a worker: from object storage in shard mode, the main process
        downloads the shards the batch needs and the worker waits for them instead of making
        its own S3 client (NOTE [ The main process fetches for its workers ])."""
        fetch = getattr(self.source, "fetch_for_workers", None)
        if self._remote and fetch is not None:
            shard_ids = self._shard_ids(indices)
            self._watch_the_cache(shard_ids, len(indices))
            fetch([self.shards[s].path for s in shard_ids])

    def _watch_the_cache(self, shard_ids: list[int], samples: int) -> None:
        """NOTE [ A cache the order thrashes ] in ``formats/cache_thrash.py``."""
        if self._thrash is None:
            cache = getattr(self.source, "cache", None)
            if cache is None or not self.shards:
                return
            self._thrash = ThrashWatch(cache.budget_bytes, self._length / len(self.shards),
                                       sum(shard.size_bytes for shard in self.shards))
        message = self._thrash.see({s: self.shards[s].size_bytes for s in shard_ids}, samples)
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _shard_ids(self, indices: list[int]) -> list[int]:
        """The shards holding these samples, each once, in order."""
        return sorted({self._position(i)[0] for i in indices})

    # NOTE [ A batch's shards at once ]
    # Remote indexes are read on first use, and in "shard" mode a sample's shard is fetched
    # whole before its bytes are returned. Sample by sample, the first shuffled batch of a
    # cold epoch touches most shards and waits for each index (GET + size) and each shard
    # (GET) in turn, in every worker: with 30 shards the first batch took 2.0 s. So the
    # indexes of up to _EAGER_REMOTE_INDEXES shards are read when the dataset is built, on a
    # few threads at once (forked workers inherit them; a pickle for spawned ones carries
    # them), and with more, each batch's missing ones are read side by side; the shards a
    # batch needs are handed to the source's download threads before its first sample is
    # read, which then waits only for its own shard.

    def _warm(self, shard_ids: list[int]) -> None:
        missing = [s for s in shard_ids if s not in self._tables]
        if len(missing) > 1:
            self._load_tables(missing)
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is not None and len(shard_ids) > 1:  # it skips the ones it holds open
            prefetch([self.shards[s].path for s in shard_ids])

    def read(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as raw bytes per field, before ``transform``."""
        s, j = self._position(index)
        path = self.shards[s].path
        columns = self.table(s).columns
        starts, offsets, sizes = columns.starts, columns.offsets, columns.sizes
        first, end = starts[j], starts[j + 1]
        offset = offsets[first] if end > first else 0
        length = offsets[end - 1] + sizes[end - 1] - offset if end > first else 0
        key = columns.keys[j]
        data = self._read_span(path, index, key, offset, length)
        sample, bad = self._sample(data, columns, path, key, j, offset, length)
        if bad is not None and drop_stale_copy(self.source, path):
            data = self._read_span(path, index, key, offset, length)
            sample, bad = self._sample(data, columns, path, key, j, offset, length)
        if bad is not None:
            value, expected, m = bad
            check_crc(value, expected, path, key, columns.fields[m], index)
        return sample

    def _read_span(self, path: str, index: int, key: str, offset: int, length: int) -> bytes:
        try:
            return self.source.read_range(path, offset, length) if length else b""
        except OSError as exc:
            raise ShardError(
                f"{path}: sample {index} (key {key!r}, bytes {offset}..{offset + length}) "
                f"could not be read: {exc}"
            ) from exc

    def _sample(self, data: bytes, columns: Any, path: str, key: str, j: int, offset: int,
                length: int) -> tuple[dict[str, Any], Any]:
        """The sample's fields from its bytes, and (value, indexed CRC, member) of the first
        member whose CRC is not the index's, or None."""
        starts, _, fields, offsets, sizes, crcs = columns
        sample: dict[str, Any] = {"__key__": key, "__url__": path}
        bad = None
        verify = self.verify_crc
        for m in range(starts[j], starts[j + 1]):
            start, size, field = offsets[m] - offset, sizes[m], fields[m]
            # A sample of one member is the whole range read: no copy of it.
            value = data if size == length else data[start : start + size]
            if verify and bad is None and crc32(value) != crcs[m]:
                bad = (value, crcs[m], m)
            if field in sample:  # an index built before such shards were refused
                raise duplicate_field(path, j, key, field)
            sample[field] = value
        return sample, bad

    def __repr__(self) -> str:
        return f"TarShards({len(self.shards)} shards, {len(self)} samples, {self.source!r})"
