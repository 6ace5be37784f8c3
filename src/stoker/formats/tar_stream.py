"""``TarShardStream``: tar shards read front to back, as an iterable dataset, for shards without
an index where scanning all of them before the first sample costs too much (a large remote
dataset read once). Prefer ``TarShards`` (map-style, exact shuffle) whenever it can be used.

Given a pack (its manifest, or the directory holding it) instead of a list of shards, it reads
the pack's file of indexes once and parses no tar: each shard's bytes are checked against its
index (its size, each member's CRC-32), 4x less CPU per sample than scanning with ``tarfile``.
A list of shards (plain WebDataset ones) is scanned as each shard arrives.

Shuffle quality (what the order is, exactly):

* the shard order is a permutation drawn from (seed, epoch), the same on every rank;
* shards go round-robin to the ``world_size x num_workers`` readers (``shard_list``); each
  reader reads its shards whole, in that order, one after the other (a pack's shard that a
  remote source downloads into its cache front to back as it arrives: NOTE [ A stream of
  pieces ]);
* each reader passes its samples through a buffer of ``shuffle_buffer`` samples and yields a
  uniformly random one of the buffer each time a new sample comes in. A sample therefore comes
  out no earlier than ``shuffle_buffer`` positions before where it went in, and samples of one
  shard stay near each other in the stream unless the buffer holds several shards' worth:
  with shards of S samples and a buffer of B, a batch mixes about B / S + 1 shards. That is
  WebDataset's shuffle; ``TarShards`` has none of these limits.
* the buffer starts yielding once it holds ``shuffle_initial`` samples (default 100, as
  WebDataset's ``initial``) and then grows to ``shuffle_buffer`` taking two samples in per one
  out: an epoch's first batch waits for about one shard instead of B / S shards, and its
  first ~B samples are drawn from a smaller buffer (from ``shuffle_initial`` growing to B).
  ``shuffle_initial=shuffle_buffer`` fills the buffer before the first sample.
* The loader gives each worker's batches in turn, so a batch holds one reader's samples.

From object storage with a cache, each reader hands its shard list to the source's ``plan``:
while it reads shard k, shards k+1 .. k+lookahead_shards download in the background (NOTE
[ Shard prefetch order ]). Over a pack, stoker's loader has its main process download them
instead: each time it asks a worker for a batch it tells the dataset how many samples it has
asked of that worker (``stoker_fetch_for_stream``), from which the dataset knows how far into
its shard list the worker has read at most (its buffer's policy, the manifest's sample counts)
and has the main process claim and fetch the shards up to there and ``lookahead_shards`` past
(NOTE [ The main process fetches for its workers ]).

Guarantees the map-style readers have and this one has not: ranks may read different numbers of
samples (when shards differ in size or their count does not divide evenly; under DDP that can
leave one rank waiting at the epoch's end: use ``TarShards``); a resume replays the epoch up to
the saved point (the loader's fast-forward of an IterableDataset); the order depends on the
world size and ``num_workers``. It is deterministic for a given seed, epoch, world size and
``num_workers``.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from stoker.distributed import ShardInfo, detect, shard_info, shard_list
from stoker.errors import ShardError
from stoker.formats._common import default_source, expand_braces
from stoker.formats.checksum import crc32
from stoker.formats.tar_arriving import samples_as_they_arrive
from stoker.formats.tar_index import (
    ShardTable,
    check_crc,
    drop_stale_copy,
    scan_bytes,
    shard_bytes,
)
from stoker.formats.tar_manifest import (
    expect_contents,
    expect_manifest_sizes,
    manifest_path,
    read_manifest,
    read_tables,
    size_mismatch,
)
from stoker.formats.tar_members import duplicate_field
from stoker.sampling.sample_rng import with_sample_seed
from stoker.storage import ByteSource
from stoker.storage.source import ByteSourceExtras, extra, extra_value

_READ_AHEAD_PIECES = 4  # NOTE [ A stream of pieces ]
_FETCH_AHEAD_PIECES = 8  # more than the reader's own, so its reads ahead are claimed already
_LARGE_SHARD = 8 << 20  # read as it arrives, no shard fetched ahead (~0.1 s at 100 MB/s)


def _data_end(table: ShardTable) -> int:
    """Where a shard's last member ends (the tar's end-of-archive blocks follow)."""
    return int(table.offsets[-1] + table.sizes[-1])


class TarShardStream(IterableDataset[Any]):
    """Samples of tar shards, streamed: the same dicts as ``TarShards`` yields (``__key__``,
    ``__url__``, one ``bytes`` per field), through ``transform``. Call ``set_epoch(n)`` before
    each epoch for a new order (stoker's loader does not know an iterable dataset's epochs; it
    gives the epoch set to its persistent workers' copies, torch's DataLoader does not).

    ``shards``: a list of ``.tar`` paths or URLs, a pattern of them (``"s-{000..099}.tar"``,
    expanded as WebDataset expands it), or a pack written by ``stoker pack`` (its
    ``index.json`` or the directory holding it), whose indexes spare the tar parsing.
    ``verify_crc``: with a pack's indexes, check each member's CRC-32 as it is read.

    ``transform`` may draw from ``stoker.sample_rng()`` / ``sample_generator()``: each sample's
    generator is seeded from ``seed``, the epoch and the sample's shard (its place in
    ``shards``) and key, so its draws are the same under any loader, ``num_workers``, shuffle
    and resume."""

    def __init__(
        self,
        shards: str | Sequence[str],
        *,
        source: ByteSource | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        shuffle_buffer: int = 1000,
        shuffle_initial: int = 100,
        seed: int = 0,
        verify_crc: bool = True,
    ) -> None:
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer={shuffle_buffer}: expected 0 (no shuffle) or more")
        if shuffle_initial < 1:
            raise ValueError(f"shuffle_initial={shuffle_initial}: expected 1 or more (samples "
                             "buffered before the first one is yielded)")
        self._tables: dict[str, ShardTable] = {}
        self._counts: dict[str, int] = {}  # a pack's samples per shard
        self._plans: dict[tuple[int, ...], tuple[list[str], list[int]]] = {}
        if isinstance(shards, str) and "{" in shards and (
                expanded := expand_braces(shards)) != [shards]:
            shards = expanded  # WebDataset's shard pattern
        if isinstance(shards, str):
            self.source = default_source(shards, source)
            manifest = manifest_path(shards)
            shards = [shards] if manifest is None else self._open_pack(manifest)
        elif shards:
            self.source = default_source(shards[0], source)
        if not shards:
            raise ValueError("no shards given: pass a list of .tar paths or URLs")
        self.shards = list(shards)
        self._numbers = {path: n for n, path in enumerate(self.shards)}  # seeds its samples
        self.transform, self.shuffle_buffer, self.seed = transform, shuffle_buffer, seed
        self.verify_crc = verify_crc
        self.shuffle_initial = min(shuffle_initial, max(1, shuffle_buffer))
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def stoker_epoch(self) -> int:
        """The epoch stoker's loader gives its persistent workers' copies with each new epoch
        (NOTE [ A dataset's epoch on persistent workers ] in ``engine.process_iter``); under
        torch's DataLoader, persistent workers keep the epoch they started with."""
        return self.epoch

    def _open_pack(self, manifest_file: str) -> list[str]:
        manifest = read_manifest(self.source, manifest_file)
        paths = [s.path for s in manifest.shards]
        self._counts = {s.path: s.samples for s in manifest.shards}
        expect_manifest_sizes(self.source, manifest.shards)  # streamed to disk, not asked
        if manifest.tables is not None:  # a pack from before the file of indexes: scanned
            self._tables = dict(zip(paths, read_tables(self.source, manifest), strict=True))
            expect_contents(self.source, self._tables)
        return paths

    def _pieces(self, path: str) -> list[str] | None:
        """What a shard of the pack is cached as (its pieces, or itself) when the source
        fetches it into a cache to serve reads by range: it is read sample by sample as it
        arrives (NOTE [ A stream of pieces ]); None: it is read whole."""
        table = self._tables.get(path)
        pieces_of = extra(self.source, ByteSourceExtras.pieces_of)
        if table is None or pieces_of is None or not len(table.offsets) or not extra_value(
                self.source, ByteSourceExtras.fetches_whole, False):
            return None
        return pieces_of(path, 0, _data_end(table))

    def _large(self, path: str) -> bool:
        """A shard read as it arrives and large enough to need no shard fetched ahead of it,
        by the main process or by the reader (NOTE [ A stream of pieces ]; one no pack
        indexes: NOTE [ A bare shard read as it arrives ] in ``tar_arriving.py``)."""
        table = self._tables.get(path)
        if table is not None:
            return table.size_bytes >= _LARGE_SHARD and self._pieces(path) is not None
        if not extra_value(self.source, ByteSourceExtras.fetches_whole, False):
            return False
        known_size = extra(self.source, ByteSourceExtras.known_size)
        size = known_size(path) if known_size is not None else None
        if size is None:  # not listed (a few shards: no listing is made for them)
            size = self.source.size(path)
        cache = extra_value(self.source, ByteSourceExtras.cache, None)
        # One that cannot be cached would be read by a range request per tar header.
        return _LARGE_SHARD <= size <= (cache.budget_bytes if cache is not None else 0)

    def _samples(self, path: str) -> Iterator[dict[str, Any]]:
        """The shard's samples, once the whole of it is checked against its index (a shard
        that is not what its index says raises before any of its samples is yielded), or,
        cached by pieces, each sample checked as it is read (NOTE [ A stream of pieces ]), or,
        a large remote shard no pack indexes, parsed as it arrives (NOTE [ A bare shard read
        as it arrives ] in ``tar_arriving.py``)."""
        pieces = self._pieces(path)
        if pieces is not None:
            yield from self._samples_by_pieces(path, pieces)
            return
        if path not in self._tables and self._large(path):
            yield from samples_as_they_arrive(self.source, path)
            return
        for attempt in range(2):
            with shard_bytes(self.source, path) as view:
                table = self._tables.get(path)
                checked = table is not None
                if table is None:
                    table = scan_bytes(view, path)  # validates the whole shard first
                columns = table.as_lists()
                if checked:
                    try:
                        self._check(view, table, columns, path)
                    except ShardError:  # NOTE [ A pack written again at the same place ]
                        if attempt == 0 and drop_stale_copy(self.source, path):
                            continue
                        raise
                starts, keys, fields, offsets, sizes, _ = columns
                for j, key in enumerate(keys):
                    sample: dict[str, Any] = {"__key__": key, "__url__": path}
                    for m in range(starts[j], starts[j + 1]):
                        if fields[m] in sample:  # an index built before such shards were refused
                            raise duplicate_field(path, j, key, fields[m])
                        sample[fields[m]] = bytes(view[offsets[m] : offsets[m] + sizes[m]])
                    yield sample
                return

    # NOTE [ A stream of pieces ]
    # A shard of a pack that the source downloads into its cache (shard mode; whole, or by
    # pieces: NOTE [ Pieces of large objects ] in storage/remote.py) is read sample by sample
    # as its bytes arrive (NOTE [ Reading a shard while it arrives ] in storage/cache.py), not
    # once the whole of it is here: with 64 MB shards at 100 MB/s each worker's first batch
    # waited ~0.64 s per shard it had to hold whole. Its size is checked
    # against its index from the manifest before its first sample, and each sample's members'
    # CRC-32s before the sample is yielded, so a shard changed since packing raises at its
    # first changed sample, after the samples before it (each as its index says; a stale
    # cached piece is dropped and read again from the store first). The reader fetches the
    # next _READ_AHEAD_PIECES pieces on its threads; over a pack under stoker's loader the main
    # process has claimed them already (stoker_fetch_for_stream: every piece up to the furthest
    # sample the worker can have read, and _FETCH_AHEAD_PIECES past it), so the reader waits
    # for those downloads and opens no client of its own.
    # A large shard read as it arrives (_LARGE_SHARD: ~0.1 s of 100 MB/s) needs no shard
    # fetched ahead of it: the next one's first sample is here a request's latency after it
    # is asked for. Neither the main process nor the reader fetches ahead of a pack holding
    # one: each download ahead took a share of the bandwidth from the shard a batch waits
    # for, and a worker's own fetches ahead, made before the main process reached those
    # shards, cost that worker an S3 client and the downloads' CPU (measured at 20,000 65 KB
    # samples in 64 MB shards, 2 workers: the workers downloaded 14 of the 18 shards with
    # s3fs, the main process 4).

    def _samples_by_pieces(self, path: str, pieces: list[str]) -> Iterator[dict[str, Any]]:
        table = self._tables[path]
        known_size = extra(self.source, ByteSourceExtras.known_size)
        size = known_size(path) if known_size is not None else None
        if size is not None and size != table.size_bytes:
            raise size_mismatch(path, size, table)
        pieces_of = extra(self.source, ByteSourceExtras.pieces_of)
        prefetch = extra(self.source, ByteSourceExtras.prefetch)
        assert pieces_of is not None
        position = {name: k for k, name in enumerate(pieces)}
        scheduled = 0  # pieces handed to prefetch so far
        starts, keys, fields, offsets, sizes, crcs = table.as_lists()
        retried, j = False, 0
        while j < len(keys):
            key, first, end = keys[j], starts[j], starts[j + 1]
            sample: dict[str, Any] = {"__key__": key, "__url__": path}
            if end > first:
                low = offsets[first]
                length = offsets[end - 1] + sizes[end - 1] - low
                if prefetch is not None:
                    reach = position[pieces_of(path, low, length)[-1]] + 1 + _READ_AHEAD_PIECES
                    if reach > scheduled:
                        prefetch(pieces[scheduled:reach])
                        scheduled = reach
                data = self.source.read_range(path, low, length)
                bad = None
                for m in range(first, end):
                    value = data[offsets[m] - low : offsets[m] - low + sizes[m]]
                    if self.verify_crc and crc32(value) != crcs[m]:
                        bad = m, value
                        break
                    if fields[m] in sample:  # an index built before such shards were refused
                        raise duplicate_field(path, j, key, fields[m])
                    sample[fields[m]] = value
                if bad is not None:
                    if not retried and drop_stale_copy(self.source, path):
                        retried = True  # NOTE [ A pack written again at the same place ]
                        continue
                    m, value = bad
                    check_crc(value, crcs[m], path, key, fields[m])
            yield sample
            j += 1

    def _check(self, view: memoryview, table: ShardTable, columns: tuple[list[Any], ...],
               path: str) -> None:
        if len(view) != table.size_bytes:
            raise size_mismatch(path, len(view), table)
        if self.verify_crc:
            starts, keys, fields, offsets, sizes, crcs = columns
            for j, key in enumerate(keys):
                for m in range(starts[j], starts[j + 1]):
                    with view[offsets[m] : offsets[m] + sizes[m]] as member:
                        intact = crc32(member) == crcs[m]
                    if not intact:  # a copy in the error: a view would keep the map open
                        member_bytes = bytes(view[offsets[m] : offsets[m] + sizes[m]])
                        check_crc(member_bytes, crcs[m], path, key, fields[m])

    def _mine(self, info: ShardInfo) -> list[str]:
        """The shards reader ``info`` reads this epoch, in order."""
        order = list(self.shards)
        random.Random(f"{self.seed}/{self.epoch}/shards").shuffle(order)
        return shard_list(order, info)

    def stoker_fetch_for_stream(self, worker_id: int, num_workers: int, samples: int) -> None:
        """Called by stoker's loader in its main process each time it asks worker
        ``worker_id`` (of ``num_workers``) for a batch, with the samples asked of it so far
        this epoch: over a remote pack in shard mode, the main process downloads the shards
        that worker reads next, and the worker waits for them instead of making its own S3
        client (NOTE [ The main process fetches for its workers ]). The samples are the same
        without it (torch's DataLoader does not call it)."""
        fetch = extra(self.source, ByteSourceExtras.fetch_for_workers)
        if fetch is None or not self._counts:
            return
        ctx = detect()
        key = (self.seed, self.epoch, ctx.rank, ctx.world_size, worker_id, num_workers)
        plan = self._plans.get(key)
        if plan is None:
            mine = self._mine(ShardInfo(ctx.rank, ctx.world_size, worker_id, num_workers))
            plan = self._plans[key] = (mine, list(itertools.accumulate(
                self._counts[p] for p in mine)))
            if len(self._plans) > 64:  # epochs long gone
                self._plans = {key: plan}
        mine, ends = plan
        # Read at most: the buffer's first shuffle_initial, then two in per one out until it
        # holds shuffle_buffer. Shards ending at or before `samples` are read whole.
        read = min(self.shuffle_initial + 2 * samples, samples + self.shuffle_buffer)
        done = bisect.bisect_right(ends, samples)
        pieces = self._pieces(mine[done]) if done < len(mine) else None
        if pieces is not None and len(pieces) > 1:
            fetch(self._pieces_to_fetch(mine, ends, done, read))
            return
        reading = bisect.bisect_left(ends, read)
        # Large shards read as they arrive need none ahead of the buffer's reach (about a
        # shard past the reader): each would take a share of the bandwidth from the shard the
        # first batch waits for (NOTE [ A stream of pieces ]).
        large = pieces is not None and self._tables[mine[done]].size_bytes >= _LARGE_SHARD
        ahead = 0 if large else extra_value(self.source, ByteSourceExtras.lookahead_shards, 0)
        fetch(mine[done : reading + 1 + ahead])

    def _pieces_to_fetch(self, mine: list[str], ends: list[int], done: int,
                         read: int) -> list[str]:
        """Every piece of ``mine[done:]`` up to the ``read``-th sample of the list, and
        ``_FETCH_AHEAD_PIECES`` past it (NOTE [ A stream of pieces ])."""
        names: list[str] = []
        past: int | None = None  # pieces still to take past the read-th sample
        for k in range(done, len(mine)):
            path = mine[k]
            pieces = self._pieces(path) or [path]
            if past is None and ends[k] >= read:  # the shard holding the read-th sample
                table = self._tables[path]
                j = min(max(read - (ends[k - 1] if k else 0), 1), len(table))
                pieces_of = extra(self.source, ByteSourceExtras.pieces_of)
                reached = len(pieces_of(path, 0, sum(table.span(j - 1)))) if pieces_of else 1
                names += pieces[:reached]
                pieces, past = pieces[reached:], _FETCH_AHEAD_PIECES
            if past is None:
                names += pieces
                continue
            names += pieces[:past]
            past -= len(pieces[:past])
            if past <= 0:
                break
        return names

    def __iter__(self) -> Iterator[Any]:
        info = shard_info()
        rng = random.Random(f"{self.seed}/{self.epoch}/{info.shard_id}/{info.num_shards}")
        buffer: list[dict[str, Any]] = []
        mine = self._mine(info)
        learn_sizes = extra(self.source, ByteSourceExtras.learn_sizes)
        if learn_sizes is not None and not self._tables and extra_value(
                self.source, ByteSourceExtras.fetches_whole, False):
            learn_sizes(mine)  # shards no pack indexes: NOTE [ A bare shard read as it arrives ]
        plan = extra(self.source, ByteSourceExtras.plan)
        if plan is not None and not any(self._large(path) for path in mine):
            plan(mine)  # a remote source fetches this reader's next shards ahead
        incoming = (sample for path in mine for sample in self._samples(path))
        for sample in incoming:
            buffer.append(sample)
            if len(buffer) <= self.shuffle_buffer:  # growing: two samples in per one out
                second = next(incoming, None)
                if second is not None:
                    buffer.append(second)
                if len(buffer) < self.shuffle_initial:
                    continue
            k = rng.randrange(len(buffer))
            buffer[k], buffer[-1] = buffer[-1], buffer[k]
            yield self._out(buffer.pop())
        rng.shuffle(buffer)
        for sample in buffer:
            yield self._out(sample)

    def _out(self, sample: dict[str, Any]) -> Any:
        if self.transform is None:
            return sample
        # NOTE [ A stream's samples have no index ] in sampling.sample_rng: this one's have
        url = sample["__url__"]
        where = f"{self._numbers.get(url, url)}/{sample['__key__']}"
        return with_sample_seed(self.transform, sample, self.seed, self.epoch, where)
