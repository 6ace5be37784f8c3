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
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from stoker.errors import ShardError
from stoker.formats._common import default_source, expand_braces
from stoker.formats.cache_thrash import ThrashWatch
from stoker.formats.checksum import crc32
from stoker.formats.tar_index import (
    ShardTable,
    check_crc,
    drop_stale_copy,
    load_index,
    scan_shard,
)
from stoker.formats.tar_manifest import (
    Manifest,
    TarShard,
    expect_contents,
    expect_manifest_sizes,
    manifest_path,
    read_manifest,
    read_tables,
    size_mismatch,
)
from stoker.formats.tar_members import duplicate_field
from stoker.storage import ByteSource
from stoker.storage.source import ByteSourceExtras, extra, extra_value, offers

_INDEX_THREADS = 8  # remote indexes read at once (NOTE [ A batch's shards at once ])
_EAGER_REMOTE_INDEXES = 256  # up to this many shards, remote indexes are read at construction
_EAGER_TABLES_BYTES = 256 << 20  # a remote index file up to this size is read at construction

@dataclass(frozen=True)
class SampleLocation:
    """Where sample bytes lie: its shard, the byte range of all its members (one ranged read),
    and each field's own (offset, size) in the shard."""

    shard: str
    key: str
    offset: int
    length: int
    fields: dict[str, tuple[int, int]]


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
        if not isinstance(path, str) and not path:
            raise ValueError(
                f"TarShards({path!r}): no shards given. Pass a pack (the directory `stoker "
                "pack` wrote, or its index.json), a .tar path, a list of them, or a pattern "
                "such as 'shards/s-{000000..000099}.tar'"
            )
        first = path if isinstance(path, str) else path[0]
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
        self._remote = bool(paths) and (offers(self.source, ByteSourceExtras.expect_sizes)
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
        known_size = extra(self.source, ByteSourceExtras.known_size)
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
                self._warm(indices, self._shard_ids(indices))
            except Exception:  # the sample that needs it reads it again and reports
                pass

    def stoker_fetch_for_batch(self, indices: list[int]) -> None:
        """Called by stoker's loader in its main process with each batch's indices as it
        sends the batch to a worker: from object storage in shard mode, the main process
        downloads the shards the batch needs and the worker waits for them instead of making
        its own S3 client (NOTE [ The main process fetches for its workers ])."""
        fetch = extra(self.source, ByteSourceExtras.fetch_for_workers)
        if self._remote and fetch is not None:
            shard_ids = self._shard_ids(indices)
            self._watch_the_cache(shard_ids, len(indices))
            fetch(self._cached_names(indices, shard_ids))

    def _watch_the_cache(self, shard_ids: list[int], samples: int) -> None:
        """NOTE [ A cache the order thrashes ] in ``formats/cache_thrash.py``."""
        if self._thrash is None:
            cache = extra_value(self.source, ByteSourceExtras.cache, None)
            if cache is None or not self.shards:
                return
            self._thrash = ThrashWatch(cache.budget_bytes, self._length / len(self.shards),
                                       sum(shard.size_bytes for shard in self.shards))
        if self._thrash.warned:  # once: the rest of the run builds no sizes for it
            return
        message = self._thrash.see({s: self.shards[s].size_bytes for s in shard_ids}, samples)
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _shard_ids(self, indices: list[int]) -> list[int]:
        """The shards holding these samples, each once, in order."""
        return sorted({self._position(i)[0] for i in indices})

    def _cached_names(self, indices: list[int], shard_ids: list[int]) -> list[str]:
        """What the source caches these samples' bytes in, each once: their shards, or the
        pieces of large ones (NOTE [ Pieces of large objects ] in ``storage/remote.py``). A
        shard whose index is not read here yet is left to the reader of its sample."""
        pieces_of = extra(self.source, ByteSourceExtras.pieces_of)
        paths = [self.shards[s].path for s in shard_ids]
        if pieces_of is None or all(
                len(pieces_of(shard.path, 0, shard.size_bytes)) == 1
                for shard in (self.shards[s] for s in shard_ids)):
            return paths  # whole shards (the default): no sample's span is needed
        names: dict[str, None] = {}
        for i in indices:
            s, j = self._position(i)
            table = self._tables.get(s)
            if table is not None:
                offset, length = table.span(j)
                names.update(dict.fromkeys(pieces_of(self.shards[s].path, offset, length)))
        return list(names)

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

    def _warm(self, indices: list[int], shard_ids: list[int]) -> None:
        missing = [s for s in shard_ids if s not in self._tables]
        if len(missing) > 1:
            self._load_tables(missing)
        prefetch = extra(self.source, ByteSourceExtras.prefetch)
        if prefetch is not None:
            names = self._cached_names(indices, shard_ids)
            if len(names) > 1:  # it skips the ones it holds open
                prefetch(names)

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
