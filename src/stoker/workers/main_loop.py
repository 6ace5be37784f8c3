"""The worker process: fetch, collate into shared memory, reply; concurrently when it helps.

Setup mirrors torch's worker (seeding, ``get_worker_info``, one intra-op thread,
``worker_init_fn`` once per start, its error deferred to the first task). Batches run one at
a time on the worker's main thread, which reads its socket directly, until the tuner raises
the concurrency (NOTE [ Automatic concurrency ]); then ``SamplePipeline`` fetches samples of
several batches at once, and a reader thread turns socket messages into events on one queue
next to the fetch threads' "sample done" events, so the main thread handles both in order and
stays the only one that sends. See ``workers.protocol`` for the messages and NOTE [ Loader
shutdown ] in ``engine.worker_group``.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.collate import allocating_into
from stoker.fastpaths.batched_getitem import Decline
from stoker.fastpaths.index_tensor import VectorProbe
from stoker.fetch.concurrency import ConcurrencyTuner, RunQueueMeter, declared_thread_safe
from stoker.fetch.fetchers import EMPTY, make_fetcher, source_form, vectorisable
from stoker.fetch.thread_pool import (
    JOB_READY,
    SAMPLE_DONE,
    Job,
    SamplePipeline,
    explore,
    settle,
)
from stoker.sampling.datapipes import seed_shufflers, shard
from stoker.sampling.dataset_rngs import find_dataset_rngs, reseed
from stoker.sampling.sample_rng import set_sample_context
from stoker.sampling.seeds import (
    batch_seed,
    global_seeds,
    reseeded_since,
    seed_global_rngs,
    seed_worker_rngs,
    stream_batch_seed,
)
from stoker.transport.slab_writer import SlabWriter
from stoker.workers import protocol as msg
from stoker.workers.batch_builder import BatchBuilder, Collated
from stoker.workers.inbox import EOF_, Inbox
from stoker.workers.remote_errors import RemoteError, capture
from stoker.workers.stream_states import StreamStates
from stoker.workers.worker_info import set_worker_info


class Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.epoch = spec.first_epoch
        self.exhausted = False
        self.stream_batches = 0  # an iterable's batches read from this worker's stream
        self.init_error: RemoteError | None = None
        self.builder = BatchBuilder(spec, conn)  # the slab pool and the replies
        self.inbox = Inbox(conn, self.builder.free)  # NOTE [ Idle workers take queued tasks ]
        self.fetcher: Any = None
        self.tuner: ConcurrencyTuner | None = None
        # NOTE [ Seeds set in worker_init_fn stay ]: False once worker_init_fn seeded them.
        self.seed_per_batch = spec.seed_per_batch
        self.dataset_rngs = find_dataset_rngs(spec.fetch.dataset) if spec.seed_per_batch else []
        self._events_sent = 0
        self.vector: VectorProbe | None = None
        self.pipeline: SamplePipeline | None = None
        self.run_queue = RunQueueMeter()  # this (the main) thread: where batches are fetched
        self.streams = StreamStates(spec)  # NOTE [ Worker streams resume ]

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        spec = self.spec
        seed = seed_worker_rngs(spec.base_seed, spec.worker_id)
        rank, world = 0, 1
        if spec.dist is not None:
            # Spawned workers inherit neither the process group nor torchrun's variables.
            from stoker.distributed.context import set_context

            set_context(spec.dist)
            rank, world = spec.dist.rank, spec.dist.world_size
        if spec.datapipe_seed is not None:  # a DataPipe graph: stoker.sampling.datapipes
            seed_shufflers(spec.fetch.dataset, spec.datapipe_seed)
        set_worker_info(spec.worker_id, spec.num_workers, seed, spec.fetch.dataset, rank, world)
        try:
            if spec.datapipe_ranks is not None:
                shard(spec.fetch.dataset, spec.num_workers, spec.worker_id, *spec.datapipe_ranks)
            if spec.worker_init_fn is not None:
                self._run_worker_init_fn()
            # NOTE [ Worker streams resume ]: a resumed worker's states, after worker_init_fn
            self.streams.begin(per_worker_streams=not self.seed_per_batch)
            self._new_fetcher()
        except Exception as exc:
            self.init_error = capture(
                exc, spec.worker_id, "starting (worker_init_fn or iter(dataset))"
            )

    # NOTE [ Seeds set in worker_init_fn stay ]
    # Under seeding="per_batch" the global RNGs are reseeded before every batch. A
    # worker_init_fn that seeds them itself (torch.manual_seed(...), the seed_worker recipe
    # from torch's reproducibility notes) asks for torch's per-worker streams instead, and a
    # drop-in must not overrule it: this worker then leaves the global RNGs and the dataset's
    # generators alone, exactly as under seeding="per_worker", gives no task back (a moved
    # batch would draw from another worker's stream), and the main process says so once.

    def _run_worker_init_fn(self) -> None:
        assert self.spec.worker_init_fn is not None
        before = global_seeds() if self.seed_per_batch else None
        self.spec.worker_init_fn(self.spec.worker_id)
        if before is not None and reseeded_since(before):
            self.seed_per_batch = False
            self.dataset_rngs = []

    def _new_fetcher(self) -> None:
        self.fetcher = make_fetcher(self.spec.fetch)
        self.fetcher.sample_context = (self.spec.base_seed, self.epoch)
        if self.vector is None:
            self.vector = VectorProbe(self.spec.fetch.dataset, vectorisable(self.spec.fetch),
                                      trusted=self.spec.vector_trusted,
                                      source=source_form(self.spec.fetch))
        if self.tuner is None:
            safe = declared_thread_safe(self.spec.fetch.dataset)
            self.tuner = ConcurrencyTuner(
                self.spec.concurrency, safe, can_split=self.fetcher.splittable,
                threads_promised=safe,  # NOTE [ Automatic concurrency ]
            )
        if self.pipeline is not None:
            self.pipeline.set_fetcher(self.fetcher)

    def _set_sample_context(self, index: Any) -> None:
        set_sample_context(self.spec.base_seed, self.epoch, index)

    def reset(self, epoch: int, released: list[int], datapipe_seed: int | None,
              dataset_epoch: int | None = None) -> None:
        self.epoch = epoch
        self.builder.free(released)
        self.exhausted = False
        self.stream_batches = 0
        self._answer_reset(epoch)
        if self.init_error is None:
            try:
                if datapipe_seed is not None:
                    seed_shufflers(self.spec.fetch.dataset, datapipe_seed)
                if dataset_epoch is not None:  # NOTE [ A dataset's epoch on persistent workers ]
                    self.spec.fetch.dataset.set_epoch(dataset_epoch)
                self._new_fetcher()
            except Exception as exc:
                self.init_error = capture(
                    exc, self.spec.worker_id, "starting an epoch (iter(dataset))"
                )

    def _answer_reset(self, epoch: int) -> None:
        """NOTE [ Worker streams resume ]: the states this epoch starts from, before
        ``iter(dataset)``; always sent, so the main process never waits for it in vain."""
        state = None
        if self.init_error is None:
            try:
                state = self.streams.dataset_state()
            except Exception as exc:
                self.init_error = capture(
                    exc, self.spec.worker_id, "saving its dataset's state (state_dict())"
                )
        msg.send(self.conn, msg.Started(epoch, self.streams.rngs(), state))

    # -- one batch at a time -----------------------------------------------------------------

    def run_task(self, task_id: int, indices: Any) -> None:
        if self.exhausted:
            return  # like torch: tasks after the end of an iterable are ignored
        if self.init_error is not None:
            msg.send(self.conn, msg.Failed(self.epoch, task_id, self.init_error))
            return
        assert self.tuner is not None and self.vector is not None
        self.fetcher.sample_context = (self.spec.base_seed, self.epoch)
        if self.vector.adopted and self._run_batched(task_id, indices):
            return  # no user code ran: nothing to seed
        if self.seed_per_batch:
            if self.spec.fetch.kind == "iterable":
                seed = stream_batch_seed(self.spec.base_seed, self.epoch, self.spec.worker_id,
                                         self.stream_batches)
                self.stream_batches += 1
            else:
                seed = batch_seed(self.spec.base_seed, self.epoch, task_id)
            seed_global_rngs(seed)
            reseed(self.dataset_rngs, seed)
        # A call with a whole batch only pays for cheap CPU-bound samples: probe it once the
        # tuner has settled at one fetch at a time (an I/O-bound dataset is never called so).
        if self.vector.probing and self.vector.wants_probe(
                not self.tuner.exploring and self.tuner.concurrency == 1):  # settled at one
            self._run_probe(task_id, list(indices))
            return
        if self.fetcher.splittable and (self.tuner.concurrency > 1 or self.tuner.exploring):
            try:  # sample by sample, not through gather: the dataset sees the batch here
                self.fetcher.prepare_batch(indices)
            except Exception as exc:
                self._fail(task_id, indices, exc)
                return
            job = Job(self.epoch, task_id, list(indices))
            if self.tuner.exploring:
                self._explore(job)
            else:
                self._pipeline().add(job)
            return
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            data = self.fetcher.gather(indices)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        except StopIteration:  # only iterables: map fetchers turn it into an error
            self.exhausted = True
            self._send_exhausted(task_id)
            return
        except Exception as exc:
            self._fail(task_id, indices, exc)
            return
        self._finish(task_id, indices, data, self.fetcher.skipped, (wall, cpu))

    def _run_probe(self, task_id: int, indices: list[int]) -> None:
        """NOTE [ Vectorised fetch ]: fetch the plain way, then compare with the candidate."""
        assert self.vector is not None
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            batch = self.fetcher.fetch(indices)
        except Exception as exc:
            self._fail(task_id, indices, exc)
            return
        timing = (time.perf_counter() - t0, time.thread_time() - c0)
        self.vector.check(indices, batch)
        self._finish(task_id, indices, Collated(batch), [], timing)

    def _run_batched(self, task_id: int, indices: Any) -> bool:
        """One call for the whole batch, into a slab; False: declined, fetch it the plain way."""
        assert self.vector is not None
        try:
            # sized by the batches before (the probes at least); None: torch's transport
            slab = self.builder.pool.acquire(None) if self.builder.slabs else None
        except OSError as exc:  # no slab to be had: this batch fails, the worker goes on
            self._fail(task_id, indices, exc)
            return True
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            with allocating_into(slab):
                batch = self.vector.fetch(list(indices))
        except Decline:
            if slab is not None:
                self.builder.pool.release_one(slab)
            return False
        except Exception as exc:
            if slab is not None:
                self.builder.pool.release_one(slab)
            self._fail(task_id, indices, exc)
            return True
        timing = (time.perf_counter() - t0, time.thread_time() - c0)
        self._finish(task_id, indices, Collated(batch), [], timing, slab,
                     batched=self.vector.kind or "")
        return True

    def _explore(self, job: Job) -> None:
        """Fetch alone, sample by sample, measuring; hand the rest over once concurrency rises."""
        assert self.tuner is not None
        try:
            done = explore(job, self.fetcher, self.tuner, self._set_sample_context,
                           self.spec.fetch.skip_errors)
        except Exception as exc:
            self._fail(job.task_id, job.indices, exc)
            return
        if done < len(job.indices):
            self._pipeline().add(job, start=done)
        else:
            self.job_done(job)

    def _finish(
        self, task_id: int, indices: Any, data: Any, skipped: list, timing: tuple,
        slab: SlabWriter | None = None, batched: str = "",
    ) -> None:
        """Collate into a slab (or use the one the batch is in), pack, send; feed the tuner."""
        builder = self.builder
        try:
            if slab is None:  # NOTE [ Slabs come back before the next task ]
                wait = None if self.pipeline is not None else self._read_waiting_slabs
                slab = builder.slab_for(data, wait)
            packed = builder.pack(slab, data, self.fetcher.finish)
        except StopIteration:
            if self.spec.fetch.kind != "iterable":  # map fetchers turn it into an error
                raise
            # torch's worker: a StopIteration out of an iterable's collate_fn ends this
            # worker's stream; the other workers go on.
            self.exhausted = True
            self._send_exhausted(task_id)
            return
        except Exception as exc:  # OSError: no slab to be had; the worker goes on
            self._fail(task_id, indices, exc)
            return
        del data
        assert self.tuner is not None
        starved = self.pipeline is not None and self.pipeline.take_starved_share() > 0.5
        self.tuner.observe(len(indices) if isinstance(indices, list) else 1, packed.nbytes,
                           starved)
        if self.pipeline is not None:
            self.pipeline.set_concurrency(self.tuner.concurrency)
        events = self.tuner.decisions[self._events_sent:]
        self._events_sent += len(events)
        report = msg.BatchReport(
            concurrency=self.tuner.concurrency, fetch_wall_s=timing[0], fetch_cpu_s=timing[1],
            collate_s=packed.collate_s, pack_s=packed.pack_s, decisions=tuple(events),
            batched=batched, queued_s=self.run_queue.take(),
            gives_back=self.pipeline is None and self.seed_per_batch,
            init_fn_seeded=self.seed_per_batch != self.spec.seed_per_batch,
            packed_at=packed.packed_at, nbytes=packed.nbytes,
        )
        builder.done(self.epoch, task_id, packed, skipped, report, self.streams.after_batch())

    def _read_waiting_slabs(self) -> None:
        self.inbox.read_waiting(self.epoch, None)

    def _fail(self, task_id: int, indices: Any, exc: BaseException) -> None:
        self.builder.failed(self.epoch, task_id, indices, exc, self.streams.after_batch())

    def _send_exhausted(self, task_id: int) -> None:
        """The end of this worker's stream, with the states its next epoch starts from (NOTE
        [ Worker streams resume ]); an error saving them is raised with the next epoch."""
        try:
            rngs, state = self.streams.at_end()
        except Exception as exc:
            rngs, state = self.streams.rngs(), None
            self.init_error = capture(
                exc, self.spec.worker_id, "saving its dataset's state (state_dict())"
            )
        msg.send(self.conn, msg.Exhausted(self.epoch, task_id, rngs, state))

    # -- many samples at once ----------------------------------------------------------------

    def _pipeline(self) -> SamplePipeline:
        if self.pipeline is None:
            self.pipeline = SamplePipeline(self.fetcher, self.inbox.events, self.spec.base_seed)
        assert self.tuner is not None
        self.pipeline.set_concurrency(self.tuner.concurrency)
        return self.pipeline

    def job_done(self, job: Job) -> None:
        kept, skipped, error = settle(job, self.spec.fetch.skip_errors)
        if job.epoch != self.epoch:
            return  # an abandoned epoch: the main process would drop it anyway
        if error is not None:
            self._fail(job.task_id, job.indices, error)
            return
        self._finish(job.task_id, job.indices, kept if kept else EMPTY, skipped,
                     (job.wall_s, job.cpu_s))

    # -- the event loop ----------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            kind, item = self.inbox.next_event(threaded=self.pipeline is not None)
            if kind == SAMPLE_DONE:
                assert self.pipeline is not None
                if self.pipeline.sample_done(item):
                    self.job_done(item)
                continue
            if kind == JOB_READY:
                self.job_done(item)
                continue
            if kind == EOF_:
                return  # the main process is gone
            if isinstance(item, msg.Task):
                self.builder.free(item.released)
                if item.epoch != self.epoch:
                    continue
                if self.pipeline is None and self.inbox.read_waiting(self.epoch, item.task_id):
                    msg.send(self.conn, msg.Cancelled(item.epoch, item.task_id))
                    continue
                if self.inbox.stop_read_ahead():
                    return  # shutting down: a queued batch would only delay the exit
                if self.fetcher is not None:  # None: worker_init_fn failed (run_task says)
                    self.fetcher.upcoming = [  # NOTE [ Batches announced ]
                        ((self.epoch, t.task_id), t.indices)
                        for t in self.inbox.tasks_ahead(self.epoch)]
                self.run_task(item.task_id, item.indices)
            elif isinstance(item, msg.Cancel):
                continue  # started or answered already: its reply stands
            elif isinstance(item, msg.Release):
                self.builder.free(item.released)
            elif isinstance(item, msg.Reset):
                self.reset(item.epoch, item.released, item.datapipe_seed, item.dataset_epoch)
            else:
                return
