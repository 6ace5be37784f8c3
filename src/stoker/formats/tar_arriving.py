"""A plain tar shard (no index) read sample by sample while its download is still under way.

NOTE [ A bare shard read as it arrives ]
``TarShardStream`` over a list of shards that no pack indexes (WebDataset's layout) used to
fetch each remote shard whole, then scan it, then yield its first sample: a 64 MB shard at
100 MB/s shared by 2 workers held each worker's first batch for ~1.3 s, and the whole shard
was read into the worker's memory when its size was not known (752 MiB peak PSS added at 2
workers). A remote shard in ``"shard"`` mode whose size is known (one listing of its directory
per reader: ``learn_sizes``), at least ``_LARGE_SHARD`` and within the cache's budget (one that
cannot be cached would be parsed by a range request per tar header: 42 GETs for an 8 MB shard
of 8 samples, measured) is read here instead: its download
starts on the source's threads, written front to back into the cache (NOTE [ Reading a shard
while it arrives ] in ``storage/cache.py``), and the tar headers are parsed through reads by
range that wait for the bytes they need (``scan_samples``). A sample is given once the header
after its last member has been read, so its bytes are there; each member is then one read.
The samples are the same as the whole-shard reading gives, in the same order. The difference
is on a damaged shard: the samples before the damage are given before the error (WebDataset
does the same), where the whole-shard reading raised before the shard's first sample. Smaller
shards are read whole as before: one download of a few MB takes less than the requests of a
parse by range.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stoker.formats._common import SourceFile
from stoker.formats.tar_index import scan_samples
from stoker.storage import ByteSource
from stoker.storage.source import ByteSourceExtras, extra


def samples_as_they_arrive(source: ByteSource, path: str) -> Iterator[dict[str, Any]]:
    """The samples of the tar shard ``path`` (size known to ``source``) as WebDataset groups
    them, each read as soon as its bytes have arrived; its download is scheduled first."""
    prefetch = extra(source, ByteSourceExtras.prefetch)
    if prefetch is not None:
        prefetch([path])  # its thread takes the download's lock: the reads below wait for it
    shard = SourceFile(source, path)
    for key, members in scan_samples(shard, shard.length, path):
        low = members[0].offset
        data = source.read_range(path, low, members[-1].offset + members[-1].length - low)
        sample: dict[str, Any] = {"__key__": key, "__url__": path}
        for member in members:
            start = member.offset - low
            sample[member.field] = data[start : start + member.length]
        yield sample
