"""``stoker.Mix``'s parts: the per-source cursors of the iterable mix and the map-style
schedule (see ``stoker.mix``). Given what they read (lengths, generators), never the mix."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker.distributed.iterable import ShardInfo, shard_iterable

if TYPE_CHECKING:
    from collections.abc import Callable

    from stoker.mix.checks import Stop

_CHUNK_MAX = 1 << 22  # draws per RNG call when building a map-style schedule
_MAX_DRAWS = 1 << 32  # a map-style schedule longer than this is a mistake, not a plan


class _End:
    def __repr__(self) -> str:
        return "<end of source>"


END: Any = _End()


class MapCursor:
    """Reads a map-style source in seeded rounds: this shard's slice of each permutation."""

    def __init__(self, dataset: Any, rng_of_round: Any, shard: tuple[int, int]) -> None:
        self._dataset, self._rng_of_round, self._shard = dataset, rng_of_round, shard
        self._round, self._pos = 0, 0
        self._share: np.ndarray | None = None  # built at the first read (never-drawn: free)

    def _load_round(self) -> np.ndarray:
        k, shards = self._shard
        order = self._rng_of_round(self._round).permutation(len(self._dataset))
        return order[k::shards]

    def next(self) -> Any:
        if self._share is None:
            self._share = self._load_round()
        if self._pos >= len(self._share):
            return END
        index = int(self._share[self._pos])
        self._pos += 1
        return self._dataset[index]

    def new_round(self) -> None:
        self._round, self._pos, self._share = self._round + 1, 0, None

    def state(self) -> list[int]:
        return [self._round, self._pos]

    def restore(self, saved: Sequence[int]) -> None:
        self._round, self._pos, self._share = int(saved[0]), int(saved[1]), None


class IterCursor:
    """Reads an iterable source pass by pass (every ``S``-th element when sharding)."""

    def __init__(self, dataset: Any, shard: ShardInfo | None) -> None:
        self._dataset, self._shard_info = dataset, shard
        self._round, self._pos = 0, 0
        self._it: Iterator[Any] | None = None

    def _open(self) -> Iterator[Any]:
        it = iter(self._dataset)
        return it if self._shard_info is None else shard_iterable(it, self._shard_info)

    def next(self) -> Any:
        if self._it is None:
            self._it = self._open()
        item = next(self._it, END)
        if item is not END:
            self._pos += 1
        return item

    def new_round(self) -> None:
        self._round, self._pos, self._it = self._round + 1, 0, None

    def state(self) -> list[int]:
        return [self._round, self._pos]

    def restore(self, saved: Sequence[int]) -> None:
        self._round, self._pos = int(saved[0]), int(saved[1])
        self._it = None
        if self._pos:
            it = self._open()
            skipped = sum(1 for _ in itertools.islice(it, self._pos))
            if skipped < self._pos:
                raise ValueError(
                    f"cannot resume: {type(self._dataset).__name__} yielded {skipped} samples "
                    f"(in this shard) but the state says {self._pos} were consumed; an iterable "
                    "source must yield the same sequence on every pass"
                )
            self._it = it


# -- the map-style schedule --------------------------------------------------------------------


def draw_schedule(
    rng: np.random.Generator, p: np.ndarray, lengths: np.ndarray, stop: Stop, cycle_len: int
) -> np.ndarray:
    """The source of each draw, up to the draw that ends the mix (not included)."""
    m = len(p)
    dtype = np.int8 if m < 128 else np.int32
    if stop == "cycle":
        chunks, left = [], cycle_len
        while left > 0:
            n = min(left, _CHUNK_MAX)
            chunks.append(rng.choice(m, n, p=p).astype(dtype))
            left -= n
        return np.concatenate(chunks) if chunks else np.empty(0, dtype=dtype)
    positive = np.flatnonzero(p > 0)
    need = lengths + 1  # the draw of source s that finds it exhausted is its (len+1)-th
    ratio = need[positive] / p[positive]
    estimate = ratio.min() if stop == "first_exhausted" else ratio.max()
    if estimate > _MAX_DRAWS:
        s = int(positive[np.argmax(ratio)])
        raise ValueError(
            f"Mix with stop={stop!r} would need about {estimate:.3g} draws: source {s} has "
            f"{lengths[s]} samples but is drawn with probability {p[s]:.3g}. Raise its weight, "
            "or use stop='first_exhausted' or stop='cycle' with num_samples"
        )
    size = int(min(_CHUNK_MAX, estimate * 1.1 + 256))
    found = np.full(m, -1, dtype=np.int64)
    seen = np.zeros(m, dtype=np.int64)
    chunks, offset = [], 0
    while True:
        chunk = rng.choice(m, size, p=p).astype(dtype)
        chunks.append(chunk)
        where = _positions_by_source(chunk, m)
        for s in positive[found[positive] < 0]:
            k = need[s] - seen[s]
            if len(where[s]) >= k:
                found[s] = offset + where[s][k - 1]
            seen[s] += len(where[s])
        offset += size
        hits = found[positive]
        if stop == "first_exhausted" and (hits >= 0).any():
            end = int(hits[hits >= 0].min())
            break
        if stop == "all_exhausted" and (hits >= 0).all():
            end = int(hits.max())
            break
    return np.concatenate(chunks)[:end]


def _positions_by_source(sources: np.ndarray, m: int) -> list[np.ndarray]:
    """For each source, the (increasing) positions of its draws."""
    if m <= 64:  # one sequential scan per source beats a sort for few sources
        return [np.flatnonzero(sources == s) for s in range(m)]
    order = np.argsort(sources, kind="stable")
    return np.split(order, np.cumsum(np.bincount(sources, minlength=m))[:-1])


def local_indices(
    lengths: np.ndarray, sources: np.ndarray, rng_of_source: Callable[[int], np.random.Generator]
) -> np.ndarray:
    """Index within its source of each draw: round r of source s is a seeded permutation, drawn
    from ``rng_of_source(s)`` (the mix's generator for source s this epoch)."""
    m = len(lengths)
    dtype = np.int32 if int(lengths.max(initial=0)) < 2**31 else np.int64
    local = np.empty(len(sources), dtype=dtype)
    for s, where in enumerate(_positions_by_source(sources, m)):
        if not len(where):
            continue
        n, count = int(lengths[s]), len(where)
        rng = rng_of_source(s)
        full, rest = divmod(count, n)
        parts = []
        if full:
            rounds = np.tile(np.arange(n, dtype=dtype), (full, 1))
            parts.append(rng.permuted(rounds, axis=1).ravel())
        if rest:
            parts.append(rng.choice(n, rest, replace=False).astype(dtype))
        local[where] = np.concatenate(parts)
    return local


# -- validation (errors say what to change) ----------------------------------------------------


