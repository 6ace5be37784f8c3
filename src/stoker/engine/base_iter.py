"""What every loader iterator shares: opening an epoch (sampler, seeds, resume), delivery, warnings.

Opening an epoch mirrors torch call for call, because a shared ``generator`` makes the order
of draws observable: ``iter(sampler)``, then the base seed draw (once per iterator), then (for
worker iterators) ``iter(sampler)`` again. See NOTE [ Resume state ] in ``progress``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
import warnings
import weakref
from typing import Any

from torch.utils.data import IterableDataset

from stoker._core.plan import Plan
from stoker._core.specs import FetchSpec
from stoker.engine.loader_state import EngineState
from stoker.engine.progress import EpochProgress
from stoker.engine.skips import SkipLedger
from stoker.profile.ranges import PIN, WAIT, profiling, stage_range
from stoker.sampling.datapipes import draw_shared_seed, is_iter_datapipe, seed_group
from stoker.sampling.dataset_rngs import find_dataset_rngs, warn_shared_rngs
from stoker.sampling.fast_batches import fast_iter
from stoker.sampling.rng_state import RngSnapshot
from stoker.sampling.seeds import batch_seed, draw_base_seed


def resolve_collate(collate_fn: Any) -> Any:
    """Swap torch's default collate/convert for ours (same results, writes into slabs; only
    with ``slab_transport``, else torch's own runs, NOTE [ Same as torch unless asked ]).

    torch's ``default_collate`` reads torch's ``default_collate_fn_map``, which users may have
    extended in place as torch's docs suggest; ours is given that same map so their entries
    keep working.
    """
    from torch.utils.data import _utils

    from stoker.collate import collate, default_convert

    if collate_fn is _utils.collate.default_collate:
        return functools.partial(collate, collate_fn_map=_utils.collate.default_collate_fn_map)
    if collate_fn is _utils.collate.default_convert:
        return default_convert
    return collate_fn


def effective_beyond(beyond: frozenset[str], feed: Any) -> frozenset[str]:
    """The loader's behaviours beyond torch, with what they imply: slabs for ``keep_slabs``
    and for stoker's own ``device=`` feed (its pins are the slabs, NOTE [ Slabs pinned in
    place ]); ``device=`` is not torch's argument, so nothing of torch's is given up."""
    if "keep_slabs" in beyond or feed is not None:
        beyond |= {"slab_transport"}
    return beyond


def fetch_spec_of(
    dataset: Any, collate_fn: Any, auto_collation: bool, drop_last: bool, on_error: str,
    fast_paths: bool, beyond: frozenset[str], feed: Any,
) -> FetchSpec:
    """The fetch half of a pass's plan (NOTE [ One plan ] in ``stoker._core.plan``)."""
    beyond = effective_beyond(beyond, feed)
    return FetchSpec(
        dataset=dataset,
        kind="iterable" if isinstance(dataset, IterableDataset) else "map",
        auto_collation=auto_collation,
        collate_fn=resolve_collate(collate_fn) if "slab_transport" in beyond else collate_fn,
        drop_last=drop_last,
        skip_errors=on_error == "skip",
        fast_paths=fast_paths,
        beyond=beyond,
    )


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


def _epoch_samples(index_sampler: Any) -> int | None:
    """Samples in an epoch (for a fractional skip budget); None when unknown."""
    inner = getattr(index_sampler, "sampler", index_sampler)
    try:
        return len(inner)
    except TypeError:
        return None


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
    warnings.warn(message, stacklevel=5)


def keeps_main_rngs(num_workers: int, worker_type: str, seeding: str) -> bool:
    """Whether the loader's state keeps the main process's global RNGs (NOTE [ Main streams
    resume ] in ``sampling.rng_state``): samples drawn from them in the calling thread, under
    torch's per-worker seeding, with ``num_workers=0``."""
    return num_workers == 0 and worker_type != "thread" and seeding != "per_batch"


# A batch handed out: its position, the sampler's state after it, the worker that loaded it
# (None without workers), and that worker's RNG states after it (NOTE [ Worker streams
# resume ]; None when not tracked).
Delivery = tuple[int, Any, "int | None", Any]

class BaseIterator:
    # Worker iterators call iter(sampler) a second time after the seed draw, as torch does.
    _reiter_after_seed = False

    def __init__(self, plan: Plan, engine: EngineState, resume: dict[str, Any] | None) -> None:
        from stoker.device.attach import make_feed  # NOTE [ Import only what the loader needs ]
        from stoker.device.pin import pin_target

        self._plan = plan  # NOTE [ One plan ]: what this iterator was started with
        self._dataset = plan.dataset
        self._fetch_spec = plan.fetch
        self._index_sampler = plan.index_sampler
        self._num_workers = plan.num_workers
        self._timeout = plan.timeout
        self._seeding = plan.seeding
        self._pin_type = pin_target(plan.pin_memory, plan.pin_memory_device)
        self._pin = self._pin_type is not None
        # NOTE [ Batches on the device ]: delivery records held back while batches are ahead.
        self._feed: Any = None
        self._held: list[Delivery] | None = None
        self._pins: Any = None  # NOTE [ Slabs pinned in place ]; set by iterators with slabs
        self._feed_spec = plan.feed
        # NOTE [ Main streams resume ]: the feed (device=) reads it too: nothing pulled ahead
        self._main_rngs = plan.main_rngs
        self._rng = RngSnapshot(plan.generator, self._index_sampler, self._main_rngs)
        self._stateful = stateful_sampler_of(self._index_sampler)
        self._tracked = self._stateful if is_delivery_tracked(self._stateful) else None
        self._step_slots = plan.batch_size or 1  # nominal slots per step, for ``advance``
        self._pad_steps = plan.pad_steps
        self._generator = plan.generator
        self._engine = engine  # NOTE [ Engine state ]
        self._stats = self._engine.stats
        self._stats.beyond = self._fetch_spec.beyond
        per_batch = self._seeding == "per_batch"
        self._dataset_rngs = find_dataset_rngs(self._dataset) if per_batch else []
        if not per_batch and self._num_workers > 1:
            warn_shared_rngs(self._dataset, find_dataset_rngs(self._dataset), self._num_workers)
        self._base_seed = 0
        self._epoch = -1
        # An IterDataPipe's shufflers take a seed drawn per epoch (stoker.sampling.datapipes).
        self._iter_datapipe = is_iter_datapipe(self._dataset)
        self._seed_group = seed_group() if self._iter_datapipe else None
        self._datapipe_seed: int | None = None
        self._open_epoch(plan, resume, first=True)
        self._feed = make_feed(plan, engine.stats, self)

    def __iter__(self) -> BaseIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")

    @property
    def pins(self) -> Any:
        """The slabs' pinning (NOTE [ Slabs pinned in place ]), or None; the feed reads it."""
        return self._pins

    # -- opening an epoch --------------------------------------------------------------------

    def _open_epoch(self, plan: Plan, resume: dict[str, Any] | None, first: bool) -> None:
        """Start an epoch; ``plan`` is the new pass's: only its epoch facts are read (NOTE
        [ One plan ])."""
        if self._feed is not None:
            self._feed.reset()
        self._held = None
        self._num_yielded = 0
        self._len_reported = plan.len_reported
        self._drop_below = 0  # iterable resume: positions fetched and dropped, not delivered
        self._drop_set: set[int] = set()
        # iterable resume in workers: batches of each worker's stream to read and drop
        self._drop_worker: list[int] | None = None
        self._epoch = resume["epoch"] if resume else self._epoch + 1
        drew = first and not (resume and not resume["drew_base_seed"])
        if resume:
            ctx: Any = self._rng.restored(resume["rng"])
        else:
            self._rng.capture()
            ctx = contextlib.nullcontext()
        datapipe = self._iter_datapipe
        self._sampler_started = False  # drawn from before a resumed epoch's save point
        with ctx:
            if resume and self._stateful is not None and resume["sampler_state"] is not None:
                self._stateful.load_state_dict(resume["sampler_state"])
            if datapipe and first:
                self._datapipe_seed = draw_shared_seed(self._generator, self._seed_group)
            self._sampler_iter = self._iter_sampler()
            if drew:
                self._base_seed = draw_base_seed(self._generator)
            elif resume:
                self._base_seed = resume["base_seed"]
            if first and self._reiter_after_seed:
                self._check_before_reiter(plan)
                self._sampler_iter = self._iter_sampler()
            if datapipe and (self._reiter_after_seed or not first):
                # torch's worker iterators draw one more at their first reset (their workers
                # keep the first); a later epoch's seed goes to the workers.
                seed = draw_shared_seed(self._generator, self._seed_group)
                if not first:
                    self._datapipe_seed = seed
            self._position = 0
            self._skip: set[int] = set()
            self._sampler_snaps: dict[int, Any] = {}
            if resume:
                self._skip_delivered(resume)
        self._steps_target = self._pad_steps() if self._pad_steps is not None else None
        self._skips = SkipLedger(
            plan.skip_budget, functools.partial(_epoch_samples, self._index_sampler),
            self._engine.skip_logged,
            self._stats,
        )
        self._progress = EpochProgress(
            rng=self._rng, base_seed=self._base_seed, drew_base_seed=drew, epoch=self._epoch,
            iterations=plan.iterations, kind=self._fetch_spec.kind,
            num_workers=self._num_workers,
            # Positions read again and dropped on resume were delivered before the save.
            prefix=max(self._position, self._drop_below),
            extras={p for p in (*self._skip, *self._drop_set)
                    if p >= max(self._position, self._drop_below)},
            # Batches each worker's stream delivered: on a resume, those it drops again.
            worker_batches=(list(self._drop_worker) if self._drop_worker is not None
                            else self._fresh_worker_batches()),
            sampler_state=resume["sampler_state"] if resume else None,
            sampler_epoch=getattr(plan.sampler, "epoch", None),
            live_sampler=self._tracked,
            sampler_started=self._sampler_started,
        )
        self._engine.progress = self._progress

    def _fresh_worker_batches(self) -> list[int] | None:
        """Per-worker delivered counts, for an IterableDataset read by workers."""
        return None

    def _check_before_reiter(self, plan: Plan) -> None:
        """torch's worker iterator checks its arguments between the seed draw and its second
        ``iter(sampler)``: a failing check has called the sampler (``len(dataset)``) once."""

    def _iter_sampler(self) -> Any:
        return fast_iter(self._index_sampler) or iter(self._index_sampler)

    def _skip_delivered(self, resume: dict[str, Any]) -> None:
        """Move past what was delivered before the save, without fetching (map-style)."""
        prefix = resume["batches"]
        self._skip = set(resume["extra_batches"])
        if self._fetch_spec.kind == "iterable":
            # Read again, or moved by its iterator's state, from the epoch start's global RNGs;
            # the save point's come back before the next batch (NOTE [ Main streams resume ];
            # ``InlineIterator._next_data``).
            self._rng.hold_save_point()
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
        if self._tracked is not None:
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

    def _next_index(self) -> tuple[int, Any]:
        """The next (position, indices) to fetch, skipping positions delivered before a resume."""
        self._progress.sampler_started = True
        while True:
            index = next(self._sampler_iter)  # StopIteration ends the epoch
            position = self._position
            self._position += 1
            if position not in self._skip:
                if self._stateful is not None and self._tracked is None:
                    self._sampler_snaps[position] = self._stateful.state_dict()
                return position, index

    def _dropped(self, position: int, worker: int | None = None) -> bool:
        if self._drop_worker is not None and worker is not None:
            if self._drop_worker[worker] > 0:
                self._drop_worker[worker] -= 1
                # Its position was delivered before the save (already in worker_batches).
                self._progress.delivered(position)
                return True
            return False
        return position < self._drop_below or position in self._drop_set

    def _delivered(self, position: int, worker: int | None = None, rngs: Any = None) -> None:
        record = (position, self._sampler_snaps.pop(position, None), worker, rngs)
        if self._held is not None:  # copied ahead: counts once handed out
            self._held.append(record)
            return
        self._apply_delivery(record)

    def _apply_delivery(self, record: Delivery) -> None:
        self._progress.delivered(*record)
        if self._tracked is not None:
            self._tracked.advance(self._step_slots)

    # -- the device feed's view of this iterator (NOTE [ Batches on the device ]) -----------

    def hold_deliveries(self) -> None:
        self._held = []

    def release_deliveries(self) -> list[Delivery]:
        held, self._held = self._held or [], None
        return held

    def apply_deliveries(self, deliveries: list[Delivery]) -> None:
        for record in deliveries:
            self._apply_delivery(record)

    def seed_of(self, deliveries: list[Delivery]) -> int | None:
        """The per-batch seed of the batch these deliveries end with (its position)."""
        if not deliveries:
            return None
        return batch_seed(self._base_seed, self._epoch, deliveries[-1][0])

    def _host_pins(self) -> Any:
        """Registers the slabs this iterator maps, or None (NOTE [ Slabs pinned in place ])."""
        from stoker.device.attach import host_pins_for

        self._pins = host_pins_for(self._feed_device(), self._pin_type)
        if self._feed is not None:
            self._feed.pins = self._pins
        return self._pins

    def _feed_device(self) -> Any:
        spec = self._feed_spec
        return spec.device if spec is not None else None

    def _finish_epoch(self) -> None:
        self._progress.finished = True

    # -- delivery ----------------------------------------------------------------------------

    def _next_data(self) -> Any:
        raise NotImplementedError

    def _next_batch(self) -> Any:
        return self.next_host() if self._feed is None else self._feed.next()

    def __next__(self) -> Any:
        entered = self._stats.entered_next()
        try:
            if profiling():  # a torch.profiler range only while one records
                with stage_range(WAIT):
                    data = self._next_batch()
            else:
                data = self._next_batch()
        except StopIteration:
            if self._steps_target is not None and self._num_yielded < self._steps_target:
                return self._end_of_data()
            self._finish_epoch()
            self._stats.epoch_ended()
            raise
        self._stats.left_next(entered, data)
        return data

    def next_host(self) -> Any:
        """The next batch as the engine delivers it, on the host (the device feed's source)."""
        data = self._next_data()
        self._num_yielded += 1
        if (
            self._fetch_spec.kind == "iterable"
            and self._len_reported is not None
            and self._num_yielded > self._len_reported
        ):
            self._warn_length()
        return data

    def _pinned(self, data: Any) -> Any:
        if not self._pin:
            return data
        from stoker.device.pin import pin_batch

        t0 = time.perf_counter()
        pins = self._pins  # NOTE [ Slabs pinned in place ]: slab tensors are pinned already
        with stage_range(PIN):
            data = pin_batch(data, pins.covers if pins is not None and not pins.refused else None)
        self._stats.pinned(t0)
        return data

    def _end_of_data(self) -> Any:
        """A step without data on a rank whose share ran out (``shard_even="exact"``)."""
        from stoker.distributed import EndOfData

        step = self._num_yielded
        self._num_yielded += 1
        if self._tracked is not None:
            self._tracked.advance(self._step_slots)
        rank = getattr(self._tracked, "rank", 0)
        return EndOfData(rank=rank, step=step, num_batches=self._steps_target or 0)

    def _warn_length(self) -> None:
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be {self._len_reported}"
            f"(when accessing len(dataloader)), but {self._num_yielded} samples have been fetched. "
        )
        if self._num_workers > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                "for examples."
            )
        warnings.warn(message, stacklevel=3)
