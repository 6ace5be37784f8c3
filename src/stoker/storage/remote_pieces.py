"""Objects cached by pieces for reads by range: which pieces hold a range, and a range read
from them (NOTE [ Pieces of large objects ]); a part of ``RemoteSource``.

NOTE [ Pieces of large objects ]
In ``"shard"`` mode a sample read by range waits for its object's bytes to arrive (NOTE
[ Reading a shard while it arrives ] in ``cache.py``): under a global shuffle of 64 MB shards
the first batch (32 samples, ~18 of 20 shards) touches most of the dataset. With
``piece_bytes`` given, an object larger than twice it is cached by pieces instead: piece ``k``
holds bytes ``[k x piece_bytes, (k+1) x piece_bytes)``, fetched by one ranged GET and cached
under its own name (the object's URL, ``PIECE_MARK``, ``k``; tagged with the object's content
like the object). A range read takes the one or two pieces holding it; ``pieces_of`` names
them, so a reader hands the pieces a batch needs to ``fetch_for_workers`` or ``prefetch`` as it
would hand shards: the first batch waits for ~32 pieces, and every byte is still downloaded
once an epoch. Whole reads (``read``, ``fetch_local``) keep whole objects.
Off by default (``piece_bytes=None``): it multiplies the GETs (64 for a 64 MB shard at 1 MiB),
which costs a server that reads a whole object to answer a range as much as whole GETs.
Measured on the S3 server of the tests and benchmarks (moto): a 65 KB range of a 64 MB object
took 48-53 ms of the server's CPU, as much as a quarter of sending the whole object, and an
epoch of 20,000 samples in 64 MB shards by 1 MiB pieces reached 432 samples/s where whole
shards reach the network's 1,480 (``benchmarks/remote_shards.py --image-size 500x375
--shard-mb 64 --bandwidth-mbps 100``). Object stores that serve a range at its own cost (S3,
GCS, MinIO) do not pay that: give ``piece_bytes`` (e.g. ``8 << 20``, the part size AWS
advises for ranged GETs) for a fast first batch under a global shuffle of large shards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker.storage.cache import PIECE_MARK

if TYPE_CHECKING:
    from stoker.storage.cache import ShardCache
    from stoker.storage.prefetch import Prefetcher


class RemotePieces:
    """``RemoteSource``'s pieces of large objects."""

    piece_bytes: int | None
    fetch: str
    cache: ShardCache | None
    _sizes: dict[str, int]
    _prefetcher: Prefetcher

    def get_range(self, path: str, offset: int, length: int) -> bytes:  # ``RemoteRequests``'s
        raise NotImplementedError

    def _pieced(self, path: str) -> int | None:
        """The object's size when it is cached by pieces, else None (NOTE [ Pieces of large
        objects ])."""
        piece = self.piece_bytes
        if piece is None or self.fetch != "shard" or self.cache is None:
            return None
        size = self._sizes.get(path)
        return size if size is not None and size > 2 * piece else None

    def pieces_of(self, path: str, offset: int, length: int) -> list[str]:
        """The names of what holds ``length`` bytes of ``path`` from ``offset`` in the cache:
        the pieces of a large object, else the object itself (NOTE [ Pieces of large
        objects ]). Each can be handed to ``fetch_for_workers`` and ``prefetch``."""
        size = self._pieced(path)
        if size is None:
            return [path]
        piece = int(self.piece_bytes or 0)
        first = min(offset, size - 1) // piece
        last = min(offset + max(length, 1) - 1, size - 1) // piece
        return [f"{path}{PIECE_MARK}{k}" for k in range(first, last + 1)]

    def _piece_span(self, name: str) -> tuple[str, int, int] | None:
        """(object, start, end) of a piece's name; None for an object's own name."""
        path, mark, number = name.partition(PIECE_MARK)
        if not mark:
            return None
        piece = int(self.piece_bytes or 0)
        start = int(number) * piece
        return path, start, min(start + piece, self._sizes[path])

    def _read_pieces(self, path: str, offset: int, length: int) -> bytes:
        size = self._sizes[path]
        if offset + length > size:
            raise OSError(f"{path}: asked for {length} bytes at offset {offset}, the object "
                          f"is {size} bytes long: it is shorter than its index says")
        parts = []
        for name in self.pieces_of(path, offset, length):
            _, start, end = self._piece_span(name) or (path, 0, size)
            low, high = max(offset, start), min(offset + length, end)
            data = self._prefetcher.read_cached(name, low - start, high - low)
            if data is None:  # it cannot be cached (budget, full disk): from the store
                data = self.get_range(path, low, high - low)
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)
