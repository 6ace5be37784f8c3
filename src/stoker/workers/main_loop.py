"""The worker process's loop: read a task, fetch, collate into shared memory, reply;
concurrently when it helps.

Batches run one at a time on the worker's main thread, which reads its socket directly
(``Inbox``), until the tuner raises the concurrency (NOTE [ Automatic concurrency ]); then
``SamplePipeline`` fetches samples of several batches at once, and a reader thread turns socket
messages into events on one queue next to the fetch threads' "sample done" events, so the main
thread handles both in order and stays the only one that sends. What a worker does between its
batches (its start as torch's worker starts, a new epoch, the end of a stream) is
``workers.lifecycle``, over the ``WorkerState`` the two share: a batch's path stays in this
module. See ``workers.protocol`` for the messages and NOTE [ Loader shutdown ] in
``engine.worker_group``.
"""

from __future__ import annotations

import queue
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.collate import allocating_into
from stoker.fastpaths.batched_getitem import Decline
from stoker.fetch.fetchers import EMPTY
from stoker.fetch.thread_pool import (
    JOB_READY,
    SAMPLE_DONE,
    Job,
    SamplePipeline,
    explore,
    settle,
)
from stoker.sampling.dataset_rngs import reseed
from stoker.sampling.sample_rng import set_sample_context
from stoker.sampling.seeds import batch_seed, seed_global_rngs, stream_batch_seed
from stoker.transport.slab_writer import SlabWriter
from stoker.workers import feeder_stand_in, lifecycle
from stoker.workers import protocol as msg
from stoker.workers.batch_builder import Collated
from stoker.workers.lifecycle import WorkerState

MESSAGE = "message"
EOF_ = "eof"


def _read_socket(conn: Connection, events: queue.SimpleQueue) -> None:
    while True:
        try:
            message = msg.recv_from_main(conn)
        except (EOFError, OSError):
            events.put((EOF_, None))
            return
        events.put((MESSAGE, message))
        if isinstance(message, msg.Stop):
            return


# NOTE [ Idle workers take queued tasks ]
# A worker runs its tasks one after another, in the order they were sent. When another
# worker has run out of tasks (the sampler is spent, or in-order delivery waits on a slow
# batch so no new task is sent) and our running batch is a straggler (NOTE [ Only
# stragglers move ] in engine.stragglers), the main process moves a task queued here to it:
# it sends us CANCEL, and the task to the idle worker. Tasks and CANCELs wait in our socket
# in the order sent, so before starting a task we read everything already waiting: a CANCEL
# for this task or for one read ahead withdraws it (answered CANCELLED, never started). A
# CANCEL that comes too late is ignored and both workers load the batch; the main process
# keeps the first reply. Either way the batch is the same: it is seeded by its position,
# not by the worker (seeding="per_batch"). Fetch threads start tasks as they arrive, so a
# worker with a pipeline ignores CANCEL and says so in its replies.


class Inbox:
    """Events for the worker's main thread, in order: (MESSAGE, message), (EOF_, None), or a
    fetch thread's event (``fetch.thread_pool``) on the shared ``events`` queue."""

    def __init__(self, conn: Connection, free: Callable[[list[int], bool], None]) -> None:
        self.conn = conn
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # also fed by fetch threads
        self._free = free  # slab ids the main process gave back; True: the epoch ended
        self._read_ahead: deque[tuple[str, Any]] = deque()
        self._reader_started = False
        # NOTE [ A worker polls its socket directly ]
        # ``Connection.poll()`` builds a selector per call (~12 us, measured; a bare poll
        # ~2 us), once or twice a task. The same readiness (data, EOF or an error all count as
        # ready, as there) from one poll object.
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)

    def next_event(self, threaded: bool) -> tuple[str, Any]:
        """The next socket message or fetch-thread event.

        While every fetch runs on this thread (``threaded`` false), messages are read straight
        from the socket; once fetch threads exist, a reader thread feeds both into one queue
        (a message must not wait behind a slow fetch, nor a finished sample behind a read).
        """
        if self._read_ahead:  # read ahead by ``read_waiting``
            return self._read_ahead.popleft()
        if not threaded:
            return self._recv()
        if not self._reader_started:
            self._reader_started = True
            reader = threading.Thread(  # named: no "Thread-N" taken from the dataset's threads
                target=_read_socket, args=(self.conn, self.events), daemon=True,
                name="stoker-socket-reader",
            )
            reader.start()
        return self.events.get()

    def _recv(self) -> tuple[str, Any]:
        try:
            return MESSAGE, msg.recv_from_main(self.conn)
        except (EOFError, OSError):
            return EOF_, None

    def read_waiting(self, epoch: int, task_id: int | None) -> bool:
        """Read what is already waiting in the socket; True if the main process took
        ``task_id`` back. Tasks read ahead that it took back are answered here, and slabs
        it gave back are free at once; the rest waits to be the next events."""
        withdrawn = False
        while self._poll.poll(0):  # NOTE [ A worker polls its socket directly ]
            event = self._recv()
            item = event[1]
            if event[0] == MESSAGE and isinstance(item, (msg.Release, msg.Task)):
                # Slabs given back are free now, also those riding with a task read ahead.
                self._free(item.released, isinstance(item, msg.Release) and item.epoch_ended)
                if isinstance(item, msg.Release):
                    continue
                event = (MESSAGE, item._replace(released=[]))
            if event[0] != MESSAGE or not isinstance(item, msg.Cancel):
                self._read_ahead.append(event)
                if event[0] == EOF_:
                    break
                continue
            if (item.epoch, item.task_id) == (epoch, task_id):
                withdrawn = True
            else:
                self._withdraw_read_ahead(item.epoch, item.task_id)
        return withdrawn

    def stop_read_ahead(self) -> bool:
        """True once STOP (or the end of the socket) was read ahead: the main process wants
        nothing more, so the tasks before it are not started (as torch's workers skip every
        index once their ``done_event`` is set)."""
        return any(kind == EOF_ or isinstance(item, msg.Stop) for kind, item in self._read_ahead)

    def tasks_ahead(self, epoch: int) -> list[msg.Task]:
        """Tasks of ``epoch`` already read and waiting their turn (by ``read_waiting``)."""
        return [item for kind, item in self._read_ahead if kind == MESSAGE
                and isinstance(item, msg.Task) and item.epoch == epoch]

    def _withdraw_read_ahead(self, epoch: int, task_id: int) -> None:
        for event in self._read_ahead:
            item = event[1]
            if event[0] == MESSAGE and isinstance(item, msg.Task) and (
                    item.epoch, item.task_id) == (epoch, task_id):
                self._read_ahead.remove(event)  # its slabs were released when it was read
                msg.send(self.conn, msg.Cancelled(epoch, task_id))
                feeder_stand_in.after_put()  # NOTE [ torch's feeder thread in a worker ]
                return


class Worker:
    """Serves tasks: reads them (``Inbox``), runs each (fetch, collate, reply) and leaves the
    rest of a worker's life to ``workers.lifecycle``, over their shared ``WorkerState``."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.state = st = WorkerState(spec, conn)
        self.inbox = Inbox(conn, st.builder.free)  # NOTE [ Idle workers take queued tasks ]
        self._events_sent = 0  # the tuner's decisions already reported

    def start(self) -> None:
        lifecycle.start(self.state)

    # -- one batch at a time -----------------------------------------------------------------

    def run_task(self, task_id: int, indices: Any) -> None:
        """One task, its new shared memory from the worker's reused segments where no fetch
        threads run (NOTE [ torch's shared memory, reused ] in ``transport.reused_shm``)."""
        reuse = self.state.builder.reuse
        if reuse is None or not self._one_task_at_a_time() or not reuse.start_task():
            self._run_task(task_id, indices)
            return
        try:
            self._run_task(task_id, indices)
        finally:
            reuse.end_task()

    def _one_task_at_a_time(self) -> bool:
        """Fetches run on this thread alone, and will until the task ends (attributes only:
        a settled tuner is never called, NOTE [ Automatic concurrency ])."""
        st, tuner = self.state, self.state.tuner
        return st.pipeline is None and (tuner is None or tuner.concurrency == 1 and (
            tuner.settled or not tuner.threads_promised))

    def _run_task(self, task_id: int, indices: Any) -> None:
        st = self.state
        if st.exhausted:
            return  # like torch: tasks after the end of an iterable are ignored
        if st.init_error is not None:  # NOTE [ After worker_init_fn raised ] in lifecycle
            err, st.init_error = st.init_error, None
            msg.send(st.conn, msg.Failed(st.epoch, task_id, err))
            feeder_stand_in.after_put()
            return
        if st.fetcher is None:  # torch's UnboundLocalError, from its line
            try:
                lifecycle.fetch_without_fetcher(indices)
            except Exception as exc:
                st.builder.failed(st.epoch, task_id, indices, exc)
            return
        tuner, vector = st.tuner, st.vector
        assert tuner is not None and vector is not None
        st.fetcher.sample_context = (st.spec.base_seed, st.epoch)
        # A batch sampler's own batch object (a tensor, a key of the dataset's, a generator)
        # goes whole to torch's fetcher, which reads it as torch's worker does; only lists and
        # tuples are gathered at once or split into samples.
        own_paths = type(indices) is list or type(indices) is tuple
        if own_paths and vector.adopted and self._run_batched(task_id, indices):
            return  # no user code ran: nothing to seed
        if st.seed_per_batch:
            if st.spec.fetch.kind == "iterable":
                seed = stream_batch_seed(st.spec.base_seed, st.epoch, st.spec.worker_id,
                                         st.stream_batches)
                st.stream_batches += 1
            else:
                seed = batch_seed(st.spec.base_seed, st.epoch, task_id)
            seed_global_rngs(seed)
            reseed(st.dataset_rngs, seed)
        # A call with a whole batch only pays for cheap CPU-bound samples: probe it once the
        # tuner has settled at one fetch at a time (an I/O-bound dataset is never called so).
        if own_paths and vector.probing and vector.wants_probe(
                not tuner.exploring and tuner.concurrency == 1):  # settled at one
            self._run_probe(task_id, list(indices))
            return
        if own_paths and st.fetcher.splittable and (tuner.concurrency > 1 or tuner.exploring):
            try:  # sample by sample, not through gather: the dataset sees the batch here
                st.fetcher.prepare_batch(indices)
            except Exception as exc:
                self._fail(task_id, indices, exc)
                return
            job = Job(st.epoch, task_id, list(indices))
            if tuner.exploring:
                self._explore(job)
            else:
                self._pipeline().add(job)
            return
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            data = st.fetcher.gather(indices)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        except StopIteration:  # only iterables: map fetchers turn it into an error
            lifecycle.send_exhausted(st, task_id)
            return
        except Exception as exc:
            self._fail(task_id, indices, exc)
            return
        self._finish(task_id, indices, data, st.fetcher.skipped, (wall, cpu))

    def _run_probe(self, task_id: int, indices: list[int]) -> None:
        """NOTE [ Vectorised fetch ]: fetch the plain way, then compare with the candidate."""
        st = self.state
        assert st.vector is not None
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            batch = st.fetcher.fetch(indices)
        except Exception as exc:
            self._fail(task_id, indices, exc)
            return
        timing = (time.perf_counter() - t0, time.thread_time() - c0)
        st.vector.check(indices, batch)
        self._finish(task_id, indices, Collated(batch), [], timing)

    def _run_batched(self, task_id: int, indices: Any) -> bool:
        """One call for the whole batch, into a slab; False: declined, fetch it the plain way."""
        st = self.state
        assert st.vector is not None
        builder = st.builder
        try:
            # sized by the batches before (the probes at least); None: torch's transport
            slab = builder.pool.acquire(None) if builder.slabs else None
        except OSError as exc:  # no slab to be had: this batch fails, the worker goes on
            self._fail(task_id, indices, exc)
            return True
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            with allocating_into(slab):
                batch = st.vector.fetch(list(indices))
        except Decline:
            if slab is not None:
                builder.pool.release_one(slab)
            return False
        except Exception as exc:
            if slab is not None:
                builder.pool.release_one(slab)
            self._fail(task_id, indices, exc)
            return True
        timing = (time.perf_counter() - t0, time.thread_time() - c0)
        self._finish(task_id, indices, Collated(batch), [], timing, slab,
                     batched=st.vector.kind or "")
        return True

    def _explore(self, job: Job) -> None:
        """Fetch alone, sample by sample, measuring; hand the rest over once concurrency rises."""
        st = self.state
        assert st.tuner is not None
        try:
            done = explore(job, st.fetcher, st.tuner, self._set_sample_context,
                           st.spec.fetch.skip_errors)
        except Exception as exc:
            self._fail(job.task_id, job.indices, exc)
            return
        if done < len(job.indices):
            self._pipeline().add(job, start=done)
        else:
            self.job_done(job)

    def _set_sample_context(self, index: Any) -> None:
        set_sample_context(self.state.spec.base_seed, self.state.epoch, index)

    def _finish(
        self, task_id: int, indices: Any, data: Any, skipped: list, timing: tuple,
        slab: SlabWriter | None = None, batched: str = "",
    ) -> None:
        """Collate into a slab (or use the one the batch is in), pack, send; feed the tuner."""
        st = self.state
        builder = st.builder
        try:
            if slab is None:  # NOTE [ Slabs come back before the next task ]
                wait = None if st.pipeline is not None else self._read_waiting_slabs
                slab = builder.slab_for(data, wait)
            packed = builder.pack(slab, data, st.fetcher.finish)
        except StopIteration:
            if st.spec.fetch.kind != "iterable":  # map fetchers turn it into an error
                raise
            # torch's worker: a StopIteration out of an iterable's collate_fn ends this
            # worker's stream; the other workers go on.
            lifecycle.send_exhausted(st, task_id)
            return
        except Exception as exc:  # OSError: no slab to be had; the worker goes on
            self._fail(task_id, indices, exc)
            return
        del data
        tuner = st.tuner
        assert tuner is not None
        if not tuner.settled:  # told, it would only count what nothing reads again
            starved = st.pipeline is not None and st.pipeline.take_starved_share() > 0.5
            tuner.observe(len(indices) if isinstance(indices, list) else 1, packed.nbytes,
                          starved)
        if st.pipeline is not None:
            st.pipeline.set_concurrency(tuner.concurrency)
        events = tuner.decisions[self._events_sent:]
        self._events_sent += len(events)
        report = msg.BatchReport(
            concurrency=tuner.concurrency, fetch_wall_s=timing[0], fetch_cpu_s=timing[1],
            collate_s=packed.collate_s, pack_s=packed.pack_s, decisions=tuple(events),
            batched=batched, queued_s=builder.run_queue.take(),
            gives_back=st.pipeline is None and st.seed_per_batch,
            init_fn_seeded=st.seed_per_batch != st.spec.seed_per_batch,
            packed_at=packed.packed_at, nbytes=packed.nbytes,
        )
        builder.done(st.epoch, task_id, packed, skipped, report,
                     self._rngs_after_batch(batched))

    def _rngs_after_batch(self, batched: str = "") -> Any:
        """NOTE [ Worker streams resume ]: a map-style batch's reply carries the global RNG
        states after it, when they changed; taken here, not through ``StreamStates``. A batch
        gathered from torch's own classes ran no code that draws (NOTE [ torch's own
        datasets ]): the states are those of the last reply, so the reply says so (None)."""
        if batched == "torch":
            return None
        changes = self.state.streams.after_batches
        return None if changes is None else changes.take()

    def _read_waiting_slabs(self) -> None:
        self.inbox.read_waiting(self.state.epoch, None)

    def _fail(self, task_id: int, indices: Any, exc: BaseException) -> None:
        self.state.builder.failed(self.state.epoch, task_id, indices, exc,
                                  self._rngs_after_batch())

    # -- many samples at once ----------------------------------------------------------------

    def _pipeline(self) -> SamplePipeline:
        st = self.state
        if st.pipeline is None:
            st.pipeline = SamplePipeline(st.fetcher, self.inbox.events, st.spec.base_seed)
        assert st.tuner is not None
        st.pipeline.set_concurrency(st.tuner.concurrency)
        return st.pipeline

    def job_done(self, job: Job) -> None:
        kept, skipped, error = settle(job, self.state.spec.fetch.skip_errors)
        if job.epoch != self.state.epoch:
            return  # an abandoned epoch: the main process would drop it anyway
        if error is not None:
            self._fail(job.task_id, job.indices, error)
            return
        # EMPTY only when samples were skipped: an empty batch asked for is collated, as torch
        self._finish(job.task_id, job.indices, EMPTY if skipped and not kept else kept, skipped,
                     (job.wall_s, job.cpu_s))

    # -- the event loop ----------------------------------------------------------------------

    def serve(self) -> None:
        st, inbox = self.state, self.inbox
        while True:
            kind, item = inbox.next_event(threaded=st.pipeline is not None)
            if kind == SAMPLE_DONE:
                assert st.pipeline is not None
                if st.pipeline.sample_done(item):
                    self.job_done(item)
                continue
            if kind == JOB_READY:
                self.job_done(item)
                continue
            if kind == EOF_:
                return  # the main process is gone
            if isinstance(item, msg.Task):
                st.builder.free(item.released)
                if item.epoch != st.epoch:
                    continue
                if st.pipeline is None and inbox.read_waiting(st.epoch, item.task_id):
                    msg.send(st.conn, msg.Cancelled(item.epoch, item.task_id))
                    feeder_stand_in.after_put()
                    continue
                if inbox.stop_read_ahead():
                    return  # shutting down: a queued batch would only delay the exit
                if st.fetcher is not None:  # None: worker_init_fn failed (run_task says)
                    st.fetcher.upcoming = [  # NOTE [ Batches announced ]
                        ((st.epoch, t.task_id), t.indices)
                        for t in inbox.tasks_ahead(st.epoch)]
                self.run_task(item.task_id, item.indices)
            elif isinstance(item, msg.Cancel):
                continue  # started or answered already: its reply stands
            elif isinstance(item, msg.Release):
                st.builder.free(item.released, item.epoch_ended)
            elif isinstance(item, msg.Reset):
                lifecycle.reset(st, item)
            else:
                return
