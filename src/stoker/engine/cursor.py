"""An epoch's position and its resume, in one owner: which indices come next, what a resume
skips or reads again, the seeds, what was delivered, and the state dict made of it.

Every iterator (inline, threads, processes) holds one ``EpochCursor`` and asks it for the next
``(position, indices)``, tells it each batch delivered, and hands it the resume state to start
from; nothing else keeps a position. The loader's ``state_dict()`` is built on the cursor's
``EpochProgress`` (mid-epoch) or a fresh state (an epoch not begun) by ``engine.loader_resume``.

NOTE [ Resume state ]
The state is always that of the last batch handed to the user, never of what is prefetched.
It is small and plain (ints, strings, lists): the epoch's starting generator states (base64),
the base seed, how many batches of the epoch were delivered as a contiguous prefix, and the
positions delivered beyond it (only with ``in_order=False``). Resuming recomputes the epoch's
index order from the generator states, skips the delivered positions without fetching them
and continues; per-batch seeds depend only on (base seed, epoch, position), so augmentations
come out the same whatever ``num_workers`` was before or after. Under torch's per-worker
seeding each worker's own RNG states are kept as well, and the state resumes only with the same
``num_workers`` (NOTE [ Worker streams resume ] in ``engine.worker_streams``); with
``num_workers=0``, the main process's global RNG states at the epoch start and at the save point
(NOTE [ Main streams resume ] in ``sampling.rng_state``). ``state_dict()``
copies a few fields: microseconds, no worker round trip (but for one case that note names).

Opening an epoch mirrors torch call for call, because a shared ``generator`` makes the order
of draws observable: ``iter(sampler)``, then the base seed draw (once per iterator), then (for
worker iterators) ``iter(sampler)`` again.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stoker._core.plan import Plan
from stoker._core.torch_voice import (
    NEXT_INDEX_CALL,
    SAMPLER_ITER_AT_INIT_CALL,
    SAMPLER_ITER_AT_RESET_CALL,
    at_torch_call,
)
from stoker.sampling.datapipes import draw_shared_seed, is_iter_datapipe, seed_group
from stoker.sampling.fast_batches import fast_iter
from stoker.sampling.rng_state import RngSnapshot
from stoker.sampling.seeds import batch_seed, draw_base_seed

STATE_FORMAT = "stoker.DataLoader/1"

# A batch handed out: its position, the sampler's state after it, the worker that loaded it
# (None without workers), and that worker's RNG states after it (NOTE [ Worker streams
# resume ]; None when not tracked).
Delivery = tuple[int, Any, "int | None", Any]


def stateful_sampler_of(index_sampler: Any) -> Any:
    """The sampler whose own ``state_dict`` captures the epoch position, if any."""
    for obj in (index_sampler, getattr(index_sampler, "sampler", None)):
        if obj is not None and callable(getattr(obj, "state_dict", None)) and callable(
            getattr(obj, "load_state_dict", None)
        ):
            return obj
    return None


def is_delivery_tracked(sampler: Any) -> bool:
    """A sampler told of every delivered step (``advance``): its live state is the position."""
    return sampler is not None and callable(getattr(sampler, "advance", None))


def keeps_main_rngs(num_workers: int, worker_type: str, seeding: str) -> bool:
    """Whether the loader's state keeps the main process's global RNGs (NOTE [ Main streams
    resume ] in ``sampling.rng_state``): samples drawn from them in the calling thread, under
    torch's per-worker seeding, with ``num_workers=0``."""
    return num_workers == 0 and worker_type != "thread" and seeding != "per_batch"


_warned_fast_forward: weakref.WeakSet[Any] = weakref.WeakSet()


def warn_fast_forward(dataset: Any, batches: int, saved_workers: int, workers: int) -> None:
    """Once per dataset: resuming an IterableDataset re-reads what was already delivered."""
    try:
        if dataset in _warned_fast_forward:
            return
        _warned_fast_forward.add(dataset)
    except TypeError:  # not weak-referenceable: warn every time rather than never
        pass
    message = (
        f"Resuming {type(dataset).__name__} (an IterableDataset) by reading its first "
        f"{batches} batches again and dropping them: an iterable cannot seek."
    )
    if saved_workers != workers:
        message += (
            f" The state was saved with num_workers={saved_workers} and is loaded with "
            f"num_workers={workers}; each worker iterates its own copy, so the rest of the "
            "epoch is only exact with the same num_workers."
        )
    warnings.warn(message, stacklevel=6)


# -- the state ---------------------------------------------------------------------------------


@dataclass
class EpochProgress:
    """What the user has received so far in an epoch: the loader's resumable state."""

    rng: Any  # RngSnapshot of the epoch start; encoded lazily
    base_seed: int
    drew_base_seed: bool
    epoch: int  # epochs this iterator has begun before this one (persistent workers)
    iterations: int  # epochs this loader has begun before this one
    kind: str
    num_workers: int
    prefix: int = 0
    extras: set[int] = field(default_factory=set)
    finished: bool = False
    sampler_state: Any = None
    sampler_epoch: int | None = None
    live_sampler: Any = None  # a delivery-tracked sampler: its state_dict() is read live
    # An IterableDataset read by workers: batches delivered from each worker's stream. Its
    # task positions depend on when an ended worker's reply is read, its streams do not.
    worker_batches: list[int] | None = None
    # Each worker's own streams (NOTE [ Worker streams resume ] in ``engine.worker_streams``);
    # None without worker processes.
    streams: Any = None
    # Whether the epoch had drawn from its sampler (a RandomSampler without a generator draws
    # its seed from torch's global RNG at its first next()): a resume draws there before the
    # save point is put back, else after it (``EpochCursor._skip_delivered``).
    sampler_started: bool = False

    def delivered(self, position: int, sampler_state: Any = None, worker: int | None = None,
                  rngs: Any = None) -> None:
        if worker is not None and self.worker_batches is not None:
            self.worker_batches[worker] += 1
        if rngs is not None and worker is not None:  # map-style: the states after it
            self.streams.after[worker] = rngs
        if position == self.prefix:
            self.prefix += 1
            while self.prefix in self.extras:
                self.extras.discard(self.prefix)
                self.prefix += 1
            if sampler_state is not None:
                self.sampler_state = sampler_state
        else:
            self.extras.add(position)

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "iterations": self.iterations,
            "epoch": self.epoch,
            "batches": self.prefix,
            "extra_batches": sorted(self.extras),
            "finished": self.finished,
            "base_seed": self.base_seed,
            "drew_base_seed": self.drew_base_seed,
            "rng": self.rng.encoded_with_save_point(),
            "sampler_state": (
                self.live_sampler.state_dict() if self.live_sampler is not None
                else self.sampler_state
            ),
            "sampler_epoch": self.sampler_epoch,
            "sampler_started": self.sampler_started,
            "dataset_kind": self.kind,
            "num_workers": self.num_workers,
            "worker_batches": (
                list(self.worker_batches) if self.worker_batches is not None else None
            ),
        }


# -- the cursor --------------------------------------------------------------------------------


def _next_of_sampler(cursor: Any) -> Any:
    return next(cursor._sampler_iter)


class EpochCursor:
    """One iterator's position in its epochs (NOTE [ Resume state ]).

    ``open`` starts an epoch (fresh or from a resume state), ``next_index`` draws the next
    ``(position, indices)`` to load, ``dropped`` says whether a loaded batch is one a resume
    reads again and drops, ``delivered`` records a batch handed out, ``progress`` is the state.
    """

    def __init__(self, plan: Plan) -> None:
        # next() on the sampler from torch's own line (NOTE [ torch's fetchers call the
        # dataset ] in fetch.fetchers): reads this cursor's ``_sampler_iter``, as torch's
        # ``_next_index`` reads its iterator's
        self._next_index: Callable[[Any], Any] = (
            at_torch_call(*NEXT_INDEX_CALL) or _next_of_sampler)
        self._dataset = plan.dataset
        self._kind = plan.kind
        self._index_sampler = plan.index_sampler
        self._num_workers = plan.num_workers
        self._generator = plan.generator
        self.rng = RngSnapshot(plan.generator, plan.index_sampler, plan.main_rngs)
        self._stateful = stateful_sampler_of(plan.index_sampler)
        self.tracked = self._stateful if is_delivery_tracked(self._stateful) else None
        self._step_slots = plan.batch_size or 1  # nominal slots per step, for ``advance``
        self.base_seed = 0
        self.epoch = -1
        # An IterDataPipe's shufflers take a seed drawn per epoch (stoker.sampling.datapipes).
        self._iter_datapipe = is_iter_datapipe(plan.dataset)
        self._seed_group = seed_group() if self._iter_datapipe else None
        self.datapipe_seed: int | None = None
        # NOTE [ Batches on the device ]: delivery records held back while batches are ahead.
        self._held: list[Delivery] | None = None
        self.progress: EpochProgress

    # -- opening an epoch --------------------------------------------------------------------

    def open(
        self, plan: Plan, resume: dict[str, Any] | None, first: bool, reiter_after_seed: bool,
        check_before_reiter: Callable[[], None], worker_batches: list[int] | None,
        reiter_later: bool = False,
    ) -> EpochProgress:
        """Start an epoch; ``plan`` is the new pass's: only its epoch facts are read (NOTE
        [ One plan ]). Worker iterators call ``iter(sampler)`` a second time after the seed
        draw (``reiter_after_seed``), with torch's argument check between the two; with
        ``reiter_later`` that second call waits for ``reiter`` (NOTE [ The sampler's second
        pass ])."""
        self._reiter_pending = False
        self._held = None
        # iterable resume: positions fetched and dropped, not delivered
        self._drop_below = 0
        self._drop_set: set[int] = set()
        # iterable resume in workers: batches of each worker's stream to read and drop
        self._drop_worker: list[int] | None = None
        self.epoch = resume["epoch"] if resume else self.epoch + 1
        drew = first and not (resume and not resume["drew_base_seed"])
        if resume:
            ctx: Any = self.rng.restored(resume["rng"])
        else:
            self.rng.capture()
            ctx = contextlib.nullcontext()
        datapipe = self._iter_datapipe
        self._sampler_started = False  # drawn from before a resumed epoch's save point
        with ctx:
            loaded = resume["sampler_state"] if resume and self._stateful is not None else None
            if loaded is not None:
                self._stateful.load_state_dict(loaded)
            if datapipe and first:
                self.datapipe_seed = draw_shared_seed(self._generator, self._seed_group)
            self._sampler_iter = self._iter_sampler(SAMPLER_ITER_AT_INIT_CALL if first
                                                    else SAMPLER_ITER_AT_RESET_CALL)
            if drew:
                self.base_seed = draw_base_seed(self._generator)
            elif resume:
                self.base_seed = resume["base_seed"]
            if first and reiter_after_seed:
                check_before_reiter()
                if reiter_later and resume is None:
                    self._reiter_pending = True  # NOTE [ The sampler's second pass ]
                else:
                    if loaded is not None:  # a sampler whose iter() takes the position at once
                        self._stateful.load_state_dict(loaded)
                    self._sampler_iter = self._iter_sampler(SAMPLER_ITER_AT_RESET_CALL)
            if datapipe and not self._reiter_pending and (reiter_after_seed or not first):
                # torch's worker iterators draw one more at their first reset (their workers
                # keep the first); a later epoch's seed goes to the workers.
                seed = draw_shared_seed(self._generator, self._seed_group)
                if not first:
                    self.datapipe_seed = seed
            self._position = 0
            self._skip: set[int] = set()
            self._sampler_snaps: dict[int, Any] = {}
            if resume:
                self._skip_delivered(resume)
        self.progress = EpochProgress(
            rng=self.rng, base_seed=self.base_seed, drew_base_seed=drew, epoch=self.epoch,
            iterations=plan.iterations, kind=self._kind, num_workers=self._num_workers,
            # Positions read again and dropped on resume were delivered before the save.
            prefix=max(self._position, self._drop_below),
            extras={p for p in (*self._skip, *self._drop_set)
                    if p >= max(self._position, self._drop_below)},
            # Batches each worker's stream delivered: on a resume, those it drops again.
            worker_batches=(list(self._drop_worker) if self._drop_worker is not None
                            else worker_batches),
            sampler_state=resume["sampler_state"] if resume else None,
            sampler_epoch=getattr(plan.sampler, "epoch", None),
            live_sampler=self.tracked,
            sampler_started=self._sampler_started,
        )
        return self.progress

    # NOTE [ The sampler's second pass ]
    # torch's worker iterator calls iter(sampler) in its constructor, starts its workers, then
    # calls it again in its first _reset (and draws a datapipe's second seed there). A
    # sampler whose __iter__ runs at once (a plain function: a pass count, a shuffle drawn
    # from numpy's global RNG, len(dataset)) so changes the state the workers start from only
    # once, with the second call after every fork and every pickling for spawn. ``reiter``
    # makes that second call where the process iterator has started its workers. Only where
    # workers get a task as soon as they are forked (NOTE [ Tasks before the next fork ]:
    # torch's own batch samplers, whose iter() runs no code) is it made before them.

    @property
    def sampler_iter(self) -> Any:
        """The epoch's iterator over the index sampler (torch's ``_sampler_iter``)."""
        return self.__dict__.get("_sampler_iter")

    def reiter(self) -> None:
        """The second ``iter(sampler)`` of a worker iterator's first epoch, if it waits."""
        if not self._reiter_pending:
            return
        self._reiter_pending = False
        self._sampler_iter = self._iter_sampler(SAMPLER_ITER_AT_RESET_CALL)
        if self._iter_datapipe:
            draw_shared_seed(self._generator, self._seed_group)

    def _iter_sampler(self, torch_call: tuple) -> Any:
        """``iter(sampler)``, from a copy of torch's line that makes it (``torch_call``: in a
        new iterator's ``__init__`` or in ``_reset``), so a sampler's ``__iter__`` that warns
        with ``stacklevel=2`` or raises names torch's line, as under torch (NOTE [ torch's
        fetchers call the dataset ] in fetch.fetchers); torch's own samplers run no code
        there and get stoker's faster iterator."""
        fast = fast_iter(self._index_sampler)
        if fast:
            return fast
        at_torch = at_torch_call(*torch_call)
        return iter(self._index_sampler) if at_torch is None else at_torch(self)

    def _skip_delivered(self, resume: dict[str, Any]) -> None:
        """Move past what was delivered before the save, without fetching (map-style)."""
        prefix = resume["batches"]
        self._skip = set(resume["extra_batches"])
        if self._kind == "iterable":
            # Read again, or moved by its iterator's state, from the epoch start's global RNGs;
            # the save point's come back before the next batch (NOTE [ Main streams resume ];
            # ``InlineIterator._next_data``).
            self.rng.hold_save_point()
            covered = resume.get("dataset_state_covers_position") or (
                resume.get("dataset_iter_state") is not None
            )
            if covered and self._num_workers == 0:
                # Its own load_state_dict (dataset's or iterator's) moved it past them; the
                # positions (and so the per-batch seeds) continue where they were.
                self._position = prefix
                return
            # An iterable cannot seek: read the delivered batches again and drop them.
            counts = resume.get("worker_batches")
            if (self._num_workers > 0 and isinstance(counts, list)
                    and len(counts) == self._num_workers):
                # Per worker: a worker's stream does not depend on timing, its positions do.
                self._drop_worker = list(counts)
                self._skip = set()
                if any(counts):
                    warn_fast_forward(self._dataset, sum(counts), resume["num_workers"],
                                      self._num_workers)
                return
            self._drop_below, self._drop_set, self._skip = prefix, self._skip, set()
            if prefix or self._drop_set:
                warn_fast_forward(self._dataset, prefix, resume["num_workers"], self._num_workers)
            return
        if self.tracked is not None:
            self._position = prefix
            return  # its own state already starts after what was delivered
        if not (self._stateful is not None and resume["sampler_state"] is not None):
            for _ in itertools.islice(self._sampler_iter, prefix):
                pass
        self._position = prefix
        if not (prefix or self._skip or resume.get("sampler_started", True)):
            # Saved between iter() and the first next() of an iterator that draws from its
            # sampler only then (not workers: they send tasks at iter()): a RandomSampler
            # without a generator draws its seed from torch's global RNG at its first next(),
            # after the save point, so it does so here too (NOTE [ Main streams resume ]).
            return
        # Draw the next batch now, while a borrowed global RNG is still in place.
        self._sampler_started = True
        first = next(self._sampler_iter, None)
        rest = () if first is None else itertools.chain([first], self._sampler_iter)
        self._sampler_iter = iter(rest)

    # -- drawing indices ---------------------------------------------------------------------

    def next_index(self) -> tuple[int, Any]:
        """The next (position, indices) to fetch, skipping positions delivered before a resume."""
        self.progress.sampler_started = True
        while True:
            index = self._next_index(self)  # StopIteration ends the epoch
            position = self._position
            self._position += 1
            if position not in self._skip:
                if self._stateful is not None and self.tracked is None:
                    self._sampler_snaps[position] = self._stateful.state_dict()
                return position, index

    def read_again(self, position: int) -> bool:
        """Whether ``position`` is a batch an iterable's resume reads again and drops."""
        return position < self._drop_below or position in self._drop_set

    def dropped(self, position: int, worker: int | None = None) -> bool:
        """A loaded batch a resume reads again and drops (it was delivered before the save)."""
        if self._drop_worker is not None and worker is not None:
            if self._drop_worker[worker] > 0:
                self._drop_worker[worker] -= 1
                # Its position was delivered before the save (already in worker_batches).
                self.progress.delivered(position)
                return True
            return False
        return self.read_again(position)

    # -- delivery ----------------------------------------------------------------------------

    def delivered(self, position: int, worker: int | None = None, rngs: Any = None) -> None:
        record = (position, self._sampler_snaps.pop(position, None), worker, rngs)
        if self._held is not None:  # copied ahead: counts once handed out
            self._held.append(record)
            return
        self._apply(record)

    def _apply(self, record: Delivery) -> None:
        self.progress.delivered(*record)
        self.step_taken()

    def step_taken(self) -> None:
        """A step handed out (with data, or without on a rank whose share ran out,
        ``shard_even="exact"``): a delivery-tracked sampler advances by one step."""
        if self.tracked is not None:
            self.tracked.advance(self._step_slots)

    def finish(self) -> None:
        self.progress.finished = True

    # -- the device feed's view (NOTE [ Batches on the device ]) ---------------------------

    def hold_deliveries(self) -> None:
        self._held = []

    def release_deliveries(self) -> list[Delivery]:
        held, self._held = self._held or [], None
        return held

    def apply_deliveries(self, deliveries: list[Delivery]) -> None:
        for record in deliveries:
            self._apply(record)

    def seed_of(self, deliveries: list[Delivery]) -> int | None:
        """The per-batch seed of the batch these deliveries end with (its position)."""
        if not deliveries:
            return None
        return batch_seed(self.base_seed, self.epoch, deliveries[-1][0])
