"""What every loader iterator shares: its epoch cursor (``engine.cursor``: position, seeds,
resume), handing out batches (pinning, the device feed, the stats), torch's warnings (NOTE
[ torch's voice ]) and stoker's advice."""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torch.utils.data import dataloader as torch_dataloader

from stoker._core.arguments import note_iterator_check
from stoker._core.plan import Plan
from stoker._core.specs import FetchSpec
from stoker._core.torch_modes import profiler_range, profiling, unseen
from stoker._core.torch_voice import warn_at_caller
from stoker.engine.cursor import Delivery, EpochCursor
from stoker.engine.loader_state import EngineState
from stoker.engine.skips import SkipLedger
from stoker.engine.stats import PIN, WAIT, stage_range
from stoker.sampling.dataset_rngs import find_dataset_rngs, tell_shared_rngs


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


def _epoch_samples(index_sampler: Any) -> int | None:
    """Samples in an epoch (for a fractional skip budget); None when unknown."""
    inner = getattr(index_sampler, "sampler", index_sampler)
    try:
        return len(inner)
    except TypeError:
        return None


# NOTE [ torch's iterator classes ]
# Programs and frameworks tell torch's iterators by their class: Lightning's CombinedLoader
# leaves any ``_BaseDataLoaderIter`` out of its pickled state, and at the end of a fit shuts a
# ``_MultiProcessingDataLoaderIter``'s workers down by its ``_shutdown_workers``. So stoker's
# iterators are instances of the class torch's would be (``_SingleProcessDataLoaderIter``
# without workers, ``_MultiProcessingDataLoaderIter`` with them, ``_BaseDataLoaderIter`` for
# stoker's own executors), and such checks answer as under torch. Nothing of torch's class
# runs on them: what the runtime and frameworks call (``__next__``, ``__iter__``,
# ``__len__``, ``__getstate__``, ``__del__``, ``_next_data``, ``_shutdown_workers``) is
# stoker's; torch's ``__init__`` is never called, so its other private methods, which read
# torch's private attributes, still fail with AttributeError.
class BaseIterator(torch_dataloader._BaseDataLoaderIter):
    # Worker iterators call iter(sampler) a second time after the seed draw, as torch does.
    _reiter_after_seed = False
    # The range torch's iterator of this kind opens in every __next__ (NOTE [ The program's
    # torch modes see torch's calls ]): a profiler trace and TensorBoard's DataLoader view
    # find the loader by it.
    _profile_name = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"

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
        self._pin_type = pin_target(plan.pin_memory, plan.pin_memory_device,
                                    workers=plan.num_workers > 0)
        self._pin = self._pin_type is not None
        self._feed: Any = None
        self._pins: Any = None  # NOTE [ Slabs pinned in place ]; set by iterators with slabs
        self._feed_spec = plan.feed
        self._cursor = EpochCursor(plan)  # NOTE [ Resume state ]: position, seeds, state
        self._pad_steps = plan.pad_steps
        self._engine = engine  # NOTE [ Engine state ]
        self._stats = self._engine.stats
        self._stats.beyond = self._fetch_spec.beyond
        self._ranges = "profiler_ranges" in self._fetch_spec.beyond  # stoker's own, asked for
        per_batch = self._seeding == "per_batch"
        self._dataset_rngs = find_dataset_rngs(self._dataset) if per_batch else []
        if not per_batch and self._num_workers > 1:
            tell_shared_rngs(self._dataset, find_dataset_rngs(self._dataset), self._num_workers,
                             self._stats.advise)
        self._open_epoch(plan, resume, first=True)
        self._feed = make_feed(plan, engine.stats, self)

    def __iter__(self) -> BaseIterator:
        return self

    # NOTE [ What the iterator lets go of ]
    # An iterator that dies (a persistent loader deleted: the loader lets go of its objects
    # first, its iterator holds them last) frees the program's objects in the order torch's
    # iterator holds them in its attributes: the dataset, the index sampler, collate_fn, the
    # sampler's iterator, worker_init_fn. A finalizer (``__del__``, ``weakref.finalize``) of
    # the program's then runs in torch's order. stoker's iterator holds them through its own
    # parts (the plan, the fetch spec, the cursor, the engine state), in another order: so it
    # keeps them aside, drops its parts, then lets go of them one by one.

    def _let_go_in_order(self, *held: Any) -> None:
        """Drop every attribute, then ``held`` from first to last (NOTE [ What the iterator
        lets go of ]). Only from ``__del__``: the iterator is unusable afterwards."""
        keep = list(held)
        self.__dict__.clear()
        while keep:
            del keep[0]

    def _reiter_later(self, plan: Plan) -> bool:
        """Whether the second ``iter(sampler)`` waits for ``cursor.reiter`` (NOTE [ The
        sampler's second pass ] in ``engine.cursor``)."""
        return False

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        # torch's words, as torch raises them (two arguments), naming torch's class
        torchs = next(c for c in type(self).__mro__ if c.__module__ == torch_dataloader.__name__)
        raise NotImplementedError("{} cannot be pickled", torchs.__name__)

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
        self._num_yielded = 0
        self._len_reported = plan.len_reported
        progress = self._cursor.open(
            plan, resume, first, self._reiter_after_seed,
            functools.partial(self._checked_before_reiter, plan), self._fresh_worker_batches(),
            self._reiter_later(plan))
        self._steps_target = self._pad_steps() if self._pad_steps is not None else None
        self._skips = SkipLedger(
            plan.skip_budget, functools.partial(_epoch_samples, self._index_sampler),
            self._engine.skip_logged,
            self._stats,
        )
        self._engine.progress = progress

    def _fresh_worker_batches(self) -> list[int] | None:
        """Per-worker delivered counts, for an IterableDataset read by workers."""
        return None

    def _check_before_reiter(self, plan: Plan) -> None:
        """torch's worker iterator checks its arguments between the seed draw and its second
        ``iter(sampler)``: a failing check has called the sampler (``len(dataset)``) once."""

    def _checked_before_reiter(self, plan: Plan) -> None:
        try:
            self._check_before_reiter(plan)
        except AssertionError as exc:  # NOTE [ torch's errors, with a note ]
            note_iterator_check(exc, plan.prefetch_factor)
            raise

    # -- the device feed's view of this iterator (NOTE [ Batches on the device ]) -----------

    def hold_deliveries(self) -> None:
        self._cursor.hold_deliveries()

    def release_deliveries(self) -> list[Delivery]:
        return self._cursor.release_deliveries()

    def apply_deliveries(self, deliveries: list[Delivery]) -> None:
        self._cursor.apply_deliveries(deliveries)

    def seed_of(self, deliveries: list[Delivery]) -> int | None:
        """The per-batch seed of the batch these deliveries end with (its position)."""
        return self._cursor.seed_of(deliveries)

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
        self._cursor.finish()

    # -- delivery ----------------------------------------------------------------------------

    def _next_data(self) -> Any:
        raise NotImplementedError

    def _next_batch(self) -> Any:
        return self.next_host() if self._feed is None else self._feed.next()

    def __next__(self) -> Any:
        with profiler_range(self._profile_name):
            entered = self._stats.entered_next()
            try:
                if self._ranges and profiling():  # stoker's range only while one records
                    with stage_range(WAIT, True):
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
        # as torch's pin thread: unseen, and outside the program's inference_mode (a thread's)
        with stage_range(PIN, self._ranges), unseen(recorded=True), torch.inference_mode(False):
            data = pin_batch(data, pins.covers if pins is not None and not pins.refused else None)
        self._stats.pinned(t0)
        return data

    def _end_of_data(self) -> Any:
        """A step without data on a rank whose share ran out (``shard_even="exact"``)."""
        from stoker.distributed import EndOfData

        step = self._num_yielded
        self._num_yielded += 1
        self._cursor.step_taken()
        rank = getattr(self._cursor.tracked, "rank", 0)
        return EndOfData(rank=rank, step=step, num_batches=self._steps_target or 0)

    def _warn_length(self) -> None:
        """torch's warning, at the same step, attributed to the code that called ``next()``
        (torch's ``stacklevel=2`` in its ``__next__``: NOTE [ torch's voice ])."""
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
        warn_at_caller(message)
