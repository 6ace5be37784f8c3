"""``stoker.Mix``: sample from several datasets by weight, deterministically.

::

    mix = stoker.Mix([web, books, code], weights=[0.6, 0.3, 0.1], seed=0)
    loader = stoker.DataLoader(mix, batch_size=32, shuffle=True, num_workers=4)

The mix is a sequence of *draws*: each draw picks source ``s`` with probability
``weights[s] / sum(weights)``, independently, from a seeded numpy ``Generator`` (PCG64), and
takes that source's next sample. A source read to its end starts a new *round* (a new seeded
permutation for a map-style source, a new ``iter()`` for an iterable one) when the stop rule
lets the mix go on:

``"first_exhausted"`` (default)
    the mix ends at the first draw of a source that has no sample left. Every sample appears at
    most once; the larger sources are cut short (which of their samples make it in is random).
``"all_exhausted"``
    the mix ends at the draw that finds the *last* not yet exhausted source exhausted; sources
    that ran out earlier start new rounds meanwhile (they are oversampled). Every sample of
    every source appears at least once. (The rule of Hugging Face's ``interleave_datasets``.)
``"cycle"``
    sources start new rounds forever. A map-style mix then has ``num_samples`` samples (default:
    the sources' total length); an iterable one is endless unless ``num_samples`` is given.

Sources with weight 0 are never drawn (and never wait for ``all_exhausted``).

Map-style sources only: a map-style ``Dataset``
    ``len(mix)`` and the mapping index -> (source, index in source) are computed at
    construction (and by ``set_epoch``) from (seed, epoch, weights, lengths, stop,
    num_samples), vectorised with numpy: no Python per sample, ~1 s for 10 million. Each
    source's order in round ``r`` is a permutation seeded by (seed, epoch, source); ``locate(i)``
    reads the mapping, ``counts()`` gives the samples per source. Being map-style, everything
    the loader does for map-style data applies: ``shuffle``, any sampler, workers,
    ``shard=True``, resume in O(1) with no fetching, ``__getitems__`` (forwarded per source).

    Per-epoch variety. The loader's epoch autopilot calls ``set_epoch`` on the *sampler*, not
    the dataset, so by default every epoch reads the same multiset of samples; with
    ``shuffle=True`` on the loader each epoch reads it in a new order, which is enough for
    ``"all_exhausted"`` and ``"cycle"`` with unit weights. To also draw a new schedule (another
    random subset of the large sources under ``"first_exhausted"``, other repeats under
    ``"all_exhausted"``), call ``mix.set_epoch(epoch)`` before each ``iter(loader)``. It can
    change ``len(mix)``. Workers copy the dataset when they start, so do this with
    ``num_workers=0`` or non-persistent workers (``persistent_workers=True`` workers keep the
    schedule they started with). ``mix.state_dict()`` holds the epoch, and the loader saves and
    restores it with its own state.

Any iterable source: an ``IterableDataset``
    Draws are made lazily, in blocks of 1024 per RNG call. Iterating gives a ``MixIterator``
    whose ``state_dict()`` (the RNG state, the draw within the block, each source's round and
    samples consumed) and ``load_state_dict()`` resume it: map-style sources seek in O(1),
    iterable ones are re-read and fast-forwarded. The state is the iterator's, not the
    dataset's, on purpose: ``stoker.DataLoader`` resumes an iterable dataset by re-reading it
    and dropping what was delivered, and would apply a dataset-level position on top of that.

    Inside workers (and ranks), shard ``k`` of ``S`` (``stoker.distributed.shard_info()``:
    rank × num_workers + worker id) runs its own mix, and what is guaranteed is:

    * its source draws come from a generator seeded by (seed, epoch, k, S);
    * it reads every ``S``-th element of each iterable source starting at ``k`` (pass
      ``shard_sources=False`` if the sources split themselves across workers already), and the
      ``k``-th slice of each round's permutation of each map-style source: within a round no
      sample is read by two shards;
    * the proportions hold per shard; stop rules apply per shard (shards may end at different
      lengths); ``num_samples`` is split across shards, summing to it;
    * the output depends only on (seed, epoch, weights, stop, num_samples, k, S) and the
      sources' contents, so the loader's fast-forward resume is exact with the same
      ``num_workers`` and world size. The union over shards is *not* the single-process mix.

    Iterable sources must yield the same sequence on every pass (rounds and resume re-read
    them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from stoker.distributed.iterable import ShardInfo, shard_info
from stoker.mix.checks import (
    Stop,
    check_empty_sources,
    check_num_samples,
    check_seed,
    check_sources,
    check_stop,
    is_sequence_of_sources,
    short,
)
from stoker.mix.cursors import END, IterCursor, MapCursor, draw_schedule, local_indices

__all__ = ["Mix", "MixIterator"]

_STATE_FORMAT = "stoker.Mix/1"
_BLOCK = 1024  # source draws per RNG call in the iterable mix


class Mix(Dataset):
    """Weighted, seeded mix of datasets (module docstring). Map-style when every source is.

    * ``datasets``: the sources, a list of map-style datasets (``__len__`` and
      ``__getitem__``) and/or ``IterableDataset`` objects.
    * ``weights``: relative sampling rates, one per source, >= 0 and not all 0 (default:
      equal).
    * ``seed``: an int >= 0; the mix is a function of it, the epoch and the other arguments.
    * ``stop``: ``"first_exhausted"``, ``"all_exhausted"`` or ``"cycle"`` (module docstring).
    * ``num_samples``: only with ``stop="cycle"``: samples per epoch of a map-style mix
      (default: the sources' total length), samples in all for an iterable one (default:
      endless).
    * ``shard_sources``: iterable mix in workers or ranks: read each iterable source's shard
      (the default); ``False`` when the sources already split themselves.
    """

    datasets: list[Any]
    weights: list[float]
    probabilities: np.ndarray
    seed: int
    stop: Stop
    num_samples: int | None
    epoch: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Mix:
        if cls is Mix:  # dispatch on the sources; unpickling passes the subclass itself
            sources = args[0] if args else kwargs.get("datasets")
            if is_sequence_of_sources(sources):
                assert sources is not None
                iterable = any(isinstance(d, IterableDataset) for d in sources)
                cls = IterableMix if iterable else MapMix
        return super().__new__(cls)

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        stop: Stop = "first_exhausted",
        num_samples: int | None = None,
        shard_sources: bool = True,
    ) -> None:
        self.datasets, self.weights = check_sources(datasets, weights)
        total = float(sum(self.weights))
        self.probabilities = np.array([w / total for w in self.weights], dtype=np.float64)
        self.seed = check_seed(seed)
        self.stop = check_stop(stop)
        self.num_samples = check_num_samples(num_samples, self.stop)
        self.epoch = 0
        self.shard_sources = bool(shard_sources)
        check_empty_sources(self.datasets, self.weights, self.stop)

    def set_epoch(self, epoch: int) -> None:
        """Draw the schedule of ``epoch`` (default 0); see "Per-epoch variety" above."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch({epoch!r}): expected an int >= 0")
        self.epoch = epoch

    def _rng(self, *key: int) -> np.random.Generator:
        sequence = np.random.SeedSequence(self.seed, spawn_key=key)
        return np.random.Generator(np.random.PCG64(sequence))

    def _describe(self) -> dict[str, Any]:
        return {"seed": self.seed, "stop": self.stop, "weights": list(self.weights),
                "num_samples": self.num_samples, "sources": len(self.datasets)}

    def _check_same_mix(self, state: Any, kind: str) -> dict[str, Any]:
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"load_state_dict expects the dict returned by {kind}.state_dict() "
                f"(format {_STATE_FORMAT!r}), got {short(state)}"
            )
        mine = self._describe()
        for key, value in mine.items():
            if state.get(key) != value:
                raise ValueError(
                    f"cannot resume: the state was saved from a Mix with {key}="
                    f"{state.get(key)!r} but this one has {key}={value!r}; build the Mix with "
                    "the same sources, weights, seed, stop and num_samples as the saved one"
                )
        return state


class MapMix(Mix):
    """The map-style mix: every source is map-style (``shard_sources`` has no effect: the
    loader's sampler spreads the mix's indices over workers and ranks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lengths = np.array([len(d) for d in self.datasets], dtype=np.int64)
        if self.stop == "cycle" and self.num_samples is None:
            self.num_samples_per_epoch = int(self.lengths[self.probabilities > 0].sum())
        else:
            self.num_samples_per_epoch = self.num_samples or 0
        self._build()

    def _build(self) -> None:
        sources = draw_schedule(self._rng(self.epoch, 0), self.probabilities, self.lengths,
                                 self.stop, self.num_samples_per_epoch)
        self._source = sources
        self._local = local_indices(
            self.lengths, sources, lambda s: self._rng(self.epoch, 1 + s))

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._build()

    def __len__(self) -> int:
        return len(self._source)

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, index in that source)`` of the mix's sample ``index``."""
        i = self._checked_indices([index])[0]
        return int(self._source[i]), int(self._local[i])

    def counts(self) -> np.ndarray:
        """How many of the mix's samples come from each source (this epoch)."""
        return np.bincount(self._source, minlength=len(self.datasets))

    def __getitem__(self, index: int) -> Any:
        source, local = self.locate(index)
        return self.datasets[source][local]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch, fetched per source (with the source's own ``__getitems__`` if it has one)."""
        idx = self._checked_indices(indices)
        sources, locals_ = self._source[idx], self._local[idx]
        out: list[Any] = [None] * len(idx)
        for s in np.unique(sources):
            where = np.flatnonzero(sources == s)
            dataset = self.datasets[int(s)]
            wanted = [int(j) for j in locals_[where]]
            getitems = getattr(dataset, "__getitems__", None)
            samples = getitems(wanted) if callable(getitems) else [dataset[j] for j in wanted]
            for position, sample in zip(where.tolist(), samples, strict=True):
                out[position] = sample
        return out

    def _checked_indices(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"Mix indices must be integers, got {short(indices)}")
        n = len(self._source)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(np.asarray(indices).ravel()[np.flatnonzero((idx < 0) | (idx >= n))[0]])
            raise IndexError(f"index {bad} is out of range for a Mix of {n} samples")
        return idx

    def state_dict(self) -> dict[str, Any]:
        """The epoch of the schedule (the loader saves it with its own state)."""
        return {"format": _STATE_FORMAT, "kind": "map", "epoch": self.epoch,
                "lengths": self.lengths.tolist(), **self._describe()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = self._check_same_mix(state, "Mix")
        if state.get("lengths") != self.lengths.tolist():
            raise ValueError(
                f"cannot resume: the state was saved with source lengths {state.get('lengths')} "
                f"but these sources have {self.lengths.tolist()}; the schedule depends on them"
            )
        if state["epoch"] != self.epoch:
            self.set_epoch(int(state["epoch"]))


class IterableMix(Mix, IterableDataset):
    """The iterable mix: at least one source is an ``IterableDataset``."""

    def __iter__(self) -> MixIterator:
        return MixIterator(self, shard_info())


class MixIterator(Iterator[Any]):
    """One pass over an iterable ``Mix`` in one shard; resumable with its own state."""

    def __init__(self, mix: IterableMix, shard: ShardInfo) -> None:
        self._mix = mix
        self._shard = (shard.shard_id, shard.num_shards)
        self._info = shard
        self._start(mix.epoch)

    def _start(self, epoch: int) -> None:
        mix, (k, shards) = self._mix, self._shard
        self._epoch = epoch
        self._rng = mix._rng(epoch, 0, k, shards)
        self._block = np.empty(0, dtype=np.int64)
        self._offset = 0
        self._block_state: dict[str, Any] | None = None
        self._cursors = [self._cursor(s) for s in range(len(mix.datasets))]
        self._exhausted = [w == 0 for w in mix.weights]
        self._yielded = 0
        self._done = False
        total = mix.num_samples
        self._limit = None if total is None else total // shards + (k < total % shards)

    def _cursor(self, s: int) -> MapCursor | IterCursor:
        dataset = self._mix.datasets[s]
        if isinstance(dataset, IterableDataset):
            return IterCursor(dataset, self._info if self._mix.shard_sources else None)
        return MapCursor(dataset, lambda r: self._mix._rng(self._epoch, 1 + s, r), self._shard)

    def __iter__(self) -> MixIterator:
        return self

    def __next__(self) -> Any:
        if self._done or (self._limit is not None and self._yielded >= self._limit):
            self._done = True
            raise StopIteration
        s = self._draw()
        item = self._cursors[s].next()
        if item is END:
            item = self._source_ended(s)
        self._yielded += 1
        return item

    def _draw(self) -> int:
        if self._offset == len(self._block):
            self._block_state = dict(self._rng.bit_generator.state)
            mix = self._mix
            self._block = self._rng.choice(len(mix.datasets), _BLOCK, p=mix.probabilities)
            self._offset = 0
        s = int(self._block[self._offset])
        self._offset += 1
        return s

    def _source_ended(self, s: int) -> Any:
        stop = self._mix.stop
        self._exhausted[s] = True
        if stop == "first_exhausted" or (stop == "all_exhausted" and all(self._exhausted)):
            self._done = True
            raise StopIteration
        cursor = self._cursors[s]
        cursor.new_round()
        item = cursor.next()
        if item is END:
            name = type(self._mix.datasets[s]).__name__
            raise ValueError(
                f"Mix source {s} ({name}) yielded nothing in a whole pass (shard {self._shard[0]}"
                f" of {self._shard[1]}), so with stop={stop!r} the mix cannot go on: give it "
                "weight 0, or give it at least as many samples as there are shards "
                "(ranks x workers)"
            )
        return item

    def state_dict(self) -> dict[str, Any]:
        """Plain values: RNG state, draw offset, each source's round and samples consumed."""
        return {
            "format": _STATE_FORMAT, "kind": "iterable", **self._mix._describe(),
            "epoch": self._epoch, "shard": list(self._shard),
            "rng": self._block_state, "offset": self._offset,
            "cursors": [c.state() for c in self._cursors],
            "exhausted": list(self._exhausted), "yielded": self._yielded, "done": self._done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (map-style sources seek; iterable ones are fast-forwarded)."""
        state = self._mix._check_same_mix(state, "MixIterator")
        if list(state["shard"]) != list(self._shard):
            raise ValueError(
                f"cannot resume: the state was saved in shard {state['shard'][0]} of "
                f"{state['shard'][1]} but this iterator is shard {self._shard[0]} of "
                f"{self._shard[1]}; resume each shard with the same ranks and num_workers"
            )
        self._start(int(state["epoch"]))
        if state["rng"] is not None:
            self._rng.bit_generator.state = state["rng"]
            self._draw()  # redraw the saved block
        self._offset = int(state["offset"])
        for cursor, saved in zip(self._cursors, state["cursors"], strict=True):
            cursor.restore(saved)
        self._exhausted = [bool(e) for e in state["exhausted"]]
        self._yielded, self._done = int(state["yielded"]), bool(state["done"])


