"""num_workers=0: fetch and collate in the calling thread, like torch."""

from __future__ import annotations

import time
from typing import Any

from torch.utils.data import dataloader as torch_dataloader

from stoker._core.notes import add_note
from stoker._core.plan import Plan
from stoker.engine.base_iter import BaseIterator
from stoker.engine.loader_state import EngineState
from stoker.engine.stats import COLLATE, FETCH, stage_range
from stoker.errors import MixedDeviceError
from stoker.fastpaths.batched_getitem import Decline
from stoker.fastpaths.index_tensor import VectorProbe
from stoker.fastpaths.switch import tell_not_per_sample
from stoker.fastpaths.torch_datasets import batched_for
from stoker.fetch.fetchers import (
    EMPTY,
    IterableFetcher,
    make_fetcher,
    source_form,
    vectorisable,
)
from stoker.sampling.datapipes import distributed_settings, is_datapipe, seed_shufflers, shard
from stoker.sampling.dataset_rngs import reseed, restore_states, save_states
from stoker.sampling.sample_rng import clear_sample_context
from stoker.sampling.seeds import GlobalRngGuard, batch_seed, seed_global_rngs
from stoker.workers.remote_errors import describe_failure


class InlineIterator(BaseIterator, torch_dataloader._SingleProcessDataLoaderIter):
    # NOTE [ torch's iterator classes ]
    _profile_name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

    def __init__(
        self, plan: Plan, engine: EngineState, resume: dict[str, Any] | None = None
    ) -> None:
        super().__init__(plan, engine, resume)
        if plan.timeout != 0 and plan.num_workers == 0:
            # torch's check, where torch makes it: after the base seed is drawn (and the
            # pin_memory warning given); its words, and what to change as a note
            error = AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
            add_note(error, f"stoker: timeout={plan.timeout} needs worker processes: with "
                     "num_workers=0 batches are loaded in the calling thread and cannot time "
                     "out. Set timeout=0, or num_workers>0.")
            raise error
        if self._cursor.datapipe_seed is not None:
            seed_shufflers(self._dataset, self._cursor.datapipe_seed)
        if is_datapipe(self._dataset):
            shard(self._dataset, 1, 0, *distributed_settings())
        self._fetcher = make_fetcher(self._fetch_spec)
        self._fetcher.sample_context = (self._cursor.base_seed, self._cursor.epoch)
        # Only the form read from the source: calling __getitem__ with a whole batch runs the
        # user's code, and here nothing has measured whether that is cheap.
        # An earlier epoch of this loader that adopted the batched form vouches for it (each
        # batch still declines where it cannot be exact): no probe batches again.
        self._vector = VectorProbe(self._dataset, vectorisable(self._fetch_spec), direct=False,
                                   trusted=self._engine.vector_trusted is self._dataset,
                                   source=source_form(self._fetch_spec),
                                   torch_classes=batched_for(
                                       self._fetch_spec,
                                       plan.worker_init_fn if plan.num_workers else None))

    # -- persistent_workers=True run inline (NOTE [ Gathers need no workers ]) ------------------
    # One iterator for every epoch, as with persistent workers: the base seed is drawn once,
    # so the generator is consumed exactly as torch's persistent iterator consumes it.

    stopped = False

    def reset(self, plan: Plan) -> None:
        """The next epoch of a persistent iterator (torch's ``_reset``)."""
        self._open_epoch(plan, None, first=False)
        if self._cursor.datapipe_seed is not None:
            seed_shufflers(self._dataset, self._cursor.datapipe_seed)
            self._fetcher = make_fetcher(self._fetch_spec)
        self._fetcher.sample_context = (self._cursor.base_seed, self._cursor.epoch)

    def iterator_state(self, progress: Any) -> tuple[Any, bool]:
        """An IterableDataset's iterator state after the last batch delivered, when this
        iterator still delivers ``progress``'s epoch (else None: nothing live to describe)."""
        if self._cursor.progress is not progress or not isinstance(self._fetcher, IterableFetcher):
            return None, False
        return self._fetcher.iterator_state()

    def restore_iterator_state(self, resume: dict[str, Any] | None) -> None:
        if resume is not None and isinstance(self._fetcher, IterableFetcher):
            self._fetcher.load_iterator_state(
                resume.get("dataset_iter_state"), bool(resume.get("dataset_iter_ended"))
            )

    def shutdown(self) -> None:
        pass  # no workers to stop

    _shutdown_workers = shutdown  # torch's name, for code that calls it on persistent loaders

    def _fetch(self, position: int, index: Any) -> Any:
        if self._vector.adopted:
            batch = self._batched(index)
            if batch is not None:
                return batch  # no user code ran: nothing to seed or guard
        if self._seeding != "per_batch":
            return self._timed_fetch(index)
        # The caller's own RNG streams (dropout, their augmentations) are left as they were.
        seed = batch_seed(self._cursor.base_seed, self._cursor.epoch, position)
        saved = save_states(self._dataset_rngs)
        try:
            with GlobalRngGuard(raw=self._fetch_spec.fast_paths):
                seed_global_rngs(seed)
                reseed(self._dataset_rngs, seed)
                return self._timed_fetch(index)
        finally:
            restore_states(self._dataset_rngs, saved)

    def _timed_fetch(self, index: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            with stage_range(FETCH, self._ranges):
                data = self._fetcher.gather(index)
        finally:
            clear_sample_context()  # this is the user's thread: leave nothing behind
        t1, c1 = time.perf_counter(), time.thread_time()
        with stage_range(COLLATE, self._ranges):
            batch = self._fetcher.finish(data)
        t2 = time.perf_counter()
        stats = self._stats
        stats.fetch_wall_s += t1 - t0
        stats.fetch_cpu_s += c1 - c0
        stats.collate_s += t2 - t1
        if stats.events is not None:
            stats.events.main_stage("fetch", t0, t1)
            stats.events.main_stage("collate", t1, t2)
        if self._vector.probing and isinstance(index, list):
            self._vector.check(index, batch)
            if self._vector.adopted:
                self._engine.vector_trusted = self._dataset
                tell_not_per_sample(self._dataset, "source")
            elif not self._vector.probing and self._num_workers > 0:
                # Running inline for num_workers > 0 (NOTE [ Gathers need no workers ]) and
                # these batches reject the batched form: later epochs go back to workers.
                self._engine.inline = False
        return batch

    def _batched(self, index: Any) -> Any:
        """NOTE [ Vectorised fetch ]: the whole batch at once; None when it declines."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            batch = self._vector.fetch(index)
        except Decline:
            return None
        self._stats.fetch_wall_s += time.perf_counter() - t0
        self._stats.fetch_cpu_s += time.thread_time() - c0
        self._stats.batched += 1
        tell_not_per_sample(self._dataset, self._vector.kind or "")
        return batch

    def _next_data(self) -> Any:
        while True:
            position, index = self._cursor.next_index()
            if self._cursor.rng.held and not self._cursor.read_again(position):
                # NOTE [ Main streams resume ]: what was delivered is read again (or the
                # iterator's state loaded); the rest of the epoch draws from the global RNGs
                # as they were at the save point.
                self._cursor.rng.release_save_point()
            try:
                data = self._fetch(position, index)
            except StopIteration:
                self._cursor.rng.release_save_point()  # (an iterable that ended while read again)
                raise
            except MixedDeviceError as exc:
                raise exc.with_indices(index) if isinstance(index, list) else exc from None
            except Exception as exc:
                add_note(exc, f"stoker: raised in the main process (num_workers="
                              f"{self._num_workers}) while loading {describe_failure(index, exc)}.")
                raise
            if self._fetcher.skipped:
                self._skips.record(self._fetcher.skipped)
            if self._cursor.dropped(position):
                continue
            self._cursor.delivered(position)
            if data is EMPTY:
                self._skips.empty_step(position, self._index_sampler)
                continue
            return self._pinned(data)
