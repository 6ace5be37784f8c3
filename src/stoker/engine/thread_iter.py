"""worker_type="thread": fetch on threads of the main process; no worker processes at all.

For I/O-bound map-style datasets (remote storage, GIL-releasing decoders) threads cost less
memory than processes and need no pickling. Batches start one sample at a time while the
tuner explores (NOTE [ Automatic concurrency ]), then samples of up to ``depth`` batches run
on a ``SamplePipeline``; collation happens in the calling thread. Global-RNG datasets stay at
one fetch at a time, seeded per batch like ``num_workers=0``.
"""

from __future__ import annotations

import queue
from collections import deque
from typing import Any

from stoker._core.forked_copies import finalize_here
from stoker._core.notes import add_note
from stoker._core.plan import Plan
from stoker._core.stats import TunerEvent
from stoker.engine.base_iter import BaseIterator
from stoker.engine.loader_state import EngineState
from stoker.errors import LoaderTimeoutError, MixedDeviceError
from stoker.fetch.concurrency import ConcurrencyTuner, declared_thread_safe
from stoker.fetch.fetchers import EMPTY, make_fetcher
from stoker.fetch.thread_pool import JOB_READY, SAMPLE_DONE, Job, SamplePipeline, explore, settle
from stoker.sampling.dataset_rngs import reseed, restore_states, save_states
from stoker.sampling.sample_rng import clear_sample_context, set_sample_context
from stoker.sampling.seeds import GlobalRngGuard, batch_seed, seed_global_rngs
from stoker.workers.remote_errors import describe_failure


class ThreadIterator(BaseIterator):
    def __init__(
        self, plan: Plan, engine: EngineState, resume: dict[str, Any] | None = None
    ) -> None:
        super().__init__(plan, engine, resume)
        self._fetcher: Any = make_fetcher(self._fetch_spec)  # map-style: checked by the loader
        self._fetcher.sample_context = (self._cursor.base_seed, self._cursor.epoch)
        # worker_type="thread" is the user's promise of thread-safety (NOTE [ Automatic
        # concurrency ]).
        self._tuner = ConcurrencyTuner(
            plan.worker_concurrency, declared_thread_safe(self._dataset),
            can_split=self._fetcher.splittable, threads_promised=True,
        )
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._pipeline = SamplePipeline(self._fetcher, self._events, self._cursor.base_seed)  # type: ignore[arg-type]
        self._finalizer = finalize_here(self, self._pipeline.close)
        self._prefetch = plan.prefetch_factor or 2
        self._in_order = plan.in_order
        self._step_samples = plan.batch_size or 1
        self._order: deque[int] = deque()
        self._ready: dict[int, Job] = {}
        self._events_seen = 0

    def _note_tuner(self) -> None:
        self._stats.concurrency[0] = self._tuner.concurrency
        events = self._tuner.decisions[self._events_seen:]
        self._events_seen += len(events)
        self._stats.tuner.extend(TunerEvent(0, e.at_s, e.concurrency, e.reason) for e in events)

    def _set_context(self, index: Any) -> None:
        set_sample_context(self._cursor.base_seed, self._cursor.epoch, index)

    # -- one batch at a time -----------------------------------------------------------------

    def _next_data(self) -> Any:
        while True:
            job: Job | None
            if self._order or self._tuner.concurrency > 1:
                job = self._next_pipelined()
            else:
                job = self._next_alone()
            self._note_tuner()
            if job is None:
                continue  # handed to the pipeline mid-batch
            data = self._finish(job)
            if data is not EMPTY:
                return self._pinned(data)
            self._skips.empty_step(job.task_id, self._index_sampler)

    def _next_alone(self) -> Job | None:
        position, index = self._cursor.next_index()  # StopIteration ends the epoch
        indices = list(index) if self._fetcher.splittable else [index]
        job = Job(self._cursor.epoch, position, indices)
        saved = save_states(self._dataset_rngs)
        with GlobalRngGuard(raw=self._fetch_spec.fast_paths):
            if self._seeding == "per_batch":
                seed = batch_seed(self._cursor.base_seed, self._cursor.epoch, position)
                seed_global_rngs(seed)
                reseed(self._dataset_rngs, seed)
            try:
                if not self._fetcher.splittable:
                    job.results, job.remaining, job.whole = [self._fetcher.gather(index)], 0, True
                    return job
                done = explore(job, self._fetcher, self._tuner, self._set_context,
                               self._fetch_spec.skip_errors)
            except Exception as exc:
                add_note(exc, f"stoker: raised in the calling thread while loading "
                              f"{describe_failure(index, exc)}.")
                raise
            finally:
                clear_sample_context()  # this is the user's thread: leave nothing behind
                restore_states(self._dataset_rngs, saved)
        if done < len(job.indices):
            self._order.append(position)
            self._pipeline.set_concurrency(self._tuner.concurrency)
            self._pipeline.add(job, start=done)
            return None
        return job

    # -- many at once ------------------------------------------------------------------------

    def _fill(self) -> None:
        depth = max(self._prefetch, -(-self._tuner.concurrency // self._step_samples) + 1)
        while len(self._order) < depth:
            try:
                position, index = self._cursor.next_index()
            except StopIteration:
                return
            self._order.append(position)
            self._pipeline.add(Job(self._cursor.epoch, position, list(index)))

    def _next_pipelined(self) -> Job:
        self._fill()
        if not self._order:
            raise StopIteration
        while True:
            head = self._order[0] if self._in_order else next(iter(self._ready), None)
            if head is not None and head in self._ready:
                self._order.remove(head)
                job = self._ready.pop(head)
                self._tuner.observe(len(job.indices), 0)
                self._pipeline.set_concurrency(self._tuner.concurrency)
                return job
            self._wait_one()

    def _wait_one(self) -> None:
        try:
            kind, job = self._events.get(timeout=self._timeout or None)
        except queue.Empty:
            raise LoaderTimeoutError(
                f"DataLoader timed out after {self._timeout} seconds"
            ) from None
        if kind == JOB_READY or (kind == SAMPLE_DONE and self._pipeline.sample_done(job)):
            self._ready[job.task_id] = job

    # -- delivery ----------------------------------------------------------------------------

    def _finish(self, job: Job) -> Any:
        self._cursor.delivered(job.task_id)
        self._stats.fetch_wall_s += job.wall_s
        self._stats.fetch_cpu_s += job.cpu_s
        if job.whole:
            return self._fetcher.finish(job.results[0])
        kept, skipped, error = settle(job, self._fetch_spec.skip_errors)
        if skipped:
            self._skips.record(skipped)
        if error is not None:
            add_note(error, f"stoker: raised in a fetch thread while loading "
                            f"{describe_failure(job.indices, error)}.")
            try:
                raise error
            finally:  # no cycle through this frame (the iterator goes with the traceback)
                del error
        try:
            # EMPTY only when samples were skipped: an empty batch asked for is collated
            return self._fetcher.finish(EMPTY if skipped and not kept else kept)
        except MixedDeviceError as exc:
            raise exc.with_indices([job.indices[k] for k in range(len(job.indices))
                                    if k not in job.errors]) from None

    def _finish_epoch(self) -> None:
        super()._finish_epoch()
        # Every fetch is done at the end of an epoch: join the threads, so none outlives it.
        self._finalizer.detach()
        self._pipeline.close(wait=True)
