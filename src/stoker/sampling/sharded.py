"""``ShardedSampler``: a map-style dataset split across ranks, resumable at any world size.

Global order
    Each epoch has one global order of the ``n`` indices: ``torch.randperm(n)`` from a generator
    seeded with ``seed + epoch`` when ``shuffle``, else ``range(n)``. Rank ``r`` of ``W`` takes
    global positions ``r, r + W, r + 2W, ...``, the convention of torch's ``DistributedSampler``.

Evenness policies (``even``)
    ``"pad"``   wrap around to the start of the order until ``W`` divides the length; yields
                exactly what ``DistributedSampler(drop_last=False)`` yields (same seed).
    ``"drop"``  cut the tail so that ``W`` divides the length; yields what
                ``DistributedSampler(drop_last=True)`` yields.
    ``"exact"`` every index exactly once; ranks differ by at most one sample, so a rank can run
                out one batch early. The loader then yields ``stoker.EndOfData`` in that step
                (see ``stoker.distributed``): every rank takes ``num_batches()`` steps, and the
                short ranks see the marker instead of a batch. For evaluation, where padding
                duplicates would skew the metric and dropping would skip samples.

Progress and resume
    Iteration runs ahead of the user (prefetch), so the sampler does not count what it yielded;
    the loader reports what the user received with ``advance(slots)``. A *slot* is one position
    of this rank's share. The rule: after delivering each step, call ``advance(batch_size)`` with
    the loader's nominal batch size, also for a short last batch and for an ``EndOfData`` step
    (``advance(1)`` per sample when ``batch_size=None``). Counting nominal slots rather than
    samples keeps the count identical on every rank: after ``k`` steps each rank has passed
    ``k*B`` slots, and the union of what the ranks received is exactly the first ``k*B*W``
    global positions. (Counting real samples would not: with ``exact``, a short rank that
    received its last sample cannot tell whether the long ranks have received theirs.)

    ``state_dict()["consumed_global"]`` is that prefix length, clamped to ``n``; once a pass has
    covered its whole share it is ``n`` (for ``drop`` the cut tail counts as read; a partial
    batch the loader drops with ``drop_last=True`` was never delivered, so it stays unread).
    It is the same on every rank, so rank 0 can save it alone. ``load_state_dict()`` at any
    world size makes the next ``__iter__`` yield this rank's share of
    ``order[consumed_global:]``, evened with this sampler's policy (``pad`` wraps from the
    start of the epoch's order, so resuming at the same world size yields exactly what the
    uninterrupted run would have). It costs one permutation, no fetching. The union over new
    ranks is the unread part: exactly (``exact``), plus padding repeats (``pad``), or minus
    fewer than ``W`` tail samples (``drop``).

``len()``, ``num_batches()`` and ``state_dict()`` all describe the *current pass*: the one a
loaded state set up, or the one the last ``__iter__`` started. ``set_epoch(e)`` with a new
epoch starts over at position 0 (the same epoch keeps a loaded position, so the usual
``load_state_dict(sd); for e in range(sd["epoch"], ...): set_epoch(e)`` loop resumes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any, Literal

import torch
from torch.utils.data import DistributedSampler, Sampler

Even = Literal["pad", "drop", "exact"]
_EVEN_CHOICES: tuple[Even, ...] = ("pad", "drop", "exact")
_STATE_VERSION = 1
# Keys whose value must match on load: the global order depends on them. world_size and even
# may differ (that is the point of elastic resume).
_ORDER_KEYS = ("dataset_len", "seed", "shuffle")


class ShardedSampler(DistributedSampler):  # type: ignore[type-arg]
    """This rank's share of each epoch's global order; see the module docstring.

    It is a ``DistributedSampler`` (``num_replicas``, ``rank``, ``epoch``, ``set_epoch``), so
    frameworks that inject one where a loader has none (Lightning) leave it in place.
    ``context`` (instead of ``rank``/``world_size``) reads them when a pass starts: a loader
    built before the process group exists learns its rank when iteration begins.
    """

    def __init__(
        self,
        dataset_len: int | Sized,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        even: Even | None = None,
        context: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        Sampler.__init__(self)  # not DistributedSampler's: it requires a process group
        n = dataset_len if isinstance(dataset_len, int) else len(dataset_len)
        if isinstance(dataset_len, bool) or n < 0:
            raise ValueError(f"dataset_len must be a length >= 0, got {dataset_len!r}")
        if context is None:
            _check_rank(rank, world_size)
        self.dataset_len = n
        self._fixed_rank, self._fixed_world_size = rank, world_size
        self._context = context
        self.shuffle = shuffle
        self.seed = seed
        self.even: Even = _resolve_even(even, drop_last)
        self.drop_last = self.even == "drop"  # DistributedSampler's attribute, kept in step
        self.epoch = 0
        self._resume: int | None = None  # consumed_global waiting for the next __iter__
        self._pass_base = 0  # global position the current pass started at
        self._slots = 0  # slots of this rank's share delivered in the current pass
        self._passes = 0
        self._epoch_sets = 0  # set_epoch/load_state_dict calls, for the epoch autopilot
        self._epoch_sets_at_iter = 0

    # -- where this rank stands (read live under ``context``) ------------------------------

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self._place()[0]

    @property
    def world_size(self) -> int:
        return self._place()[1]

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return self.world_size

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        return len(self)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return self._seq_len(self._current_base())

    def _place(self) -> tuple[int, int]:
        if self._context is None:
            return self._fixed_rank, self._fixed_world_size
        rank, world_size = self._context()
        _check_rank(rank, world_size)
        return rank, world_size

    # -- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        # Not a generator: the pass's bookkeeping must happen when iter() is called, not at the
        # first next(), so that state_dict() is right even before the first sample is drawn.
        base = self._resume if self._resume is not None else 0
        self._resume = None
        self._pass_base, self._slots = base, 0
        self._passes += 1
        self._epoch_sets_at_iter = self._epoch_sets
        rank, world_size = self._place()
        seq = _even_out(self._order(), base, world_size, self.even)
        return iter(seq[rank::world_size])

    def __len__(self) -> int:
        return _share_len(self._seq_len(self._current_base()), self.rank, self.world_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:  # a new epoch starts at its beginning; the same one keeps a resume
            self._resume = None
            self._pass_base, self._slots = 0, 0
        self.epoch = epoch
        self._epoch_sets += 1

    # -- equal step counts -----------------------------------------------------------------

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """Steps every rank takes this pass: the longest share's batch count (same on all ranks)."""
        longest = _share_len(self._seq_len(self._current_base()), 0, self.world_size)
        return _batches(longest, batch_size, drop_last)

    def local_num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """Real batches this rank yields this pass; ``num_batches() - this`` steps are padding."""
        return _batches(len(self), batch_size, drop_last)

    # -- progress and resume ---------------------------------------------------------------

    def advance(self, slots: int) -> None:
        """Record that the user received ``slots`` more positions of this rank's share.

        Call with the nominal batch size once per delivered step, ``EndOfData`` steps and a
        short last batch included (module docstring, "Progress and resume").
        """
        if slots < 0:
            raise ValueError(f"advance() takes a number of slots >= 0, got {slots}")
        if self._resume is not None:
            raise RuntimeError(
                "advance() was called after load_state_dict() but before iter(): the loaded "
                "position applies to the next pass; start it with iter(sampler) first"
            )
        self._slots += slots

    def state_dict(self) -> dict[str, Any]:
        """Plain, rank-independent state of the current pass (identical on every rank)."""
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "consumed_global": self._consumed_global(),
            "dataset_len": self.dataset_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "even": self.even,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the saved epoch at its saved position; any world size; applies to next iter."""
        missing = [
            k for k in ("version", "epoch", "consumed_global", *_ORDER_KEYS) if k not in state
        ]
        if missing:
            raise ValueError(
                f"not a ShardedSampler state: missing {missing}; pass what state_dict() returned"
            )
        if state["version"] != _STATE_VERSION:
            raise ValueError(
                f"ShardedSampler state version {state['version']!r} is not supported "
                f"(this stoker reads version {_STATE_VERSION})"
            )
        for key in _ORDER_KEYS:
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the state was saved with {key}={state[key]!r} but this "
                    f"sampler has {key}={getattr(self, key)!r}; the epoch's order depends on "
                    f"{', '.join(_ORDER_KEYS)}, so build the sampler with the saved values"
                )
        consumed = int(state["consumed_global"])
        if not 0 <= consumed <= self.dataset_len:
            raise ValueError(
                f"consumed_global={consumed} is outside [0, dataset_len={self.dataset_len}]"
            )
        self.epoch = int(state["epoch"])
        self._resume = consumed
        self._pass_base, self._slots = consumed, 0
        self._epoch_sets += 1

    # -- what the epoch autopilot reads (stoker.distributed.begin_epoch) ----------------------

    @property
    def passes_started(self) -> int:
        """How many times ``__iter__`` ran."""
        return self._passes

    def epoch_set_since_last_pass(self) -> bool:
        """True when ``set_epoch``/``load_state_dict`` ran since the last ``__iter__`` began."""
        return self._epoch_sets != self._epoch_sets_at_iter

    # -- internals -------------------------------------------------------------------------

    def _order(self) -> list[int]:
        # Bit-identical to DistributedSampler.__iter__, so "pad"/"drop" match it sample for sample.
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=g).tolist()

    def _current_base(self) -> int:
        return self._resume if self._resume is not None else self._pass_base

    def _seq_len(self, base: int) -> int:
        rest = self.dataset_len - base
        if self.even == "pad":
            return rest + (-rest) % self.world_size
        if self.even == "drop":
            return rest - rest % self.world_size
        return rest

    def _consumed_global(self) -> int:
        if self._resume is not None:
            return self._resume
        done = self._slots * self.world_size
        if done >= self._seq_len(self._pass_base):
            return self.dataset_len  # whole share delivered: the epoch is read (drop: cut too)
        return min(self._pass_base + done, self.dataset_len)


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank={rank} is out of range for world_size={world_size}: "
            "expected world_size >= 1 and 0 <= rank < world_size"
        )


def _resolve_even(even: Even | None, drop_last: bool) -> Even:
    if even is None:
        return "drop" if drop_last else "pad"
    if even not in _EVEN_CHOICES:
        raise ValueError(f"even={even!r} is not one of {_EVEN_CHOICES}")
    if drop_last and even != "drop":
        raise ValueError(
            f"drop_last=True contradicts even={even!r}: drop_last=True is DistributedSampler's "
            "spelling of even='drop'; pass one of them"
        )
    return even


def _even_out(order: list[int], base: int, world_size: int, even: Even) -> list[int]:
    """The global sequence of the pass starting at ``base``, its length a multiple of W unless
    ``exact``."""
    seq = order[base:]
    if even == "pad":
        pad = (-len(seq)) % world_size
        # Wrap from the start of the *epoch's* order, as DistributedSampler does, so a resume at
        # the same world size pads with the very samples the uninterrupted run would have.
        seq += [order[i % len(order)] for i in range(pad)]
    elif even == "drop":
        seq = seq[: len(seq) - len(seq) % world_size]
    return seq


def _share_len(seq_len: int, rank: int, world_size: int) -> int:
    return max(0, (seq_len - rank + world_size - 1) // world_size)


def _batches(samples: int, batch_size: int, drop_last: bool) -> int:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return samples // batch_size if drop_last else -(-samples // batch_size)
