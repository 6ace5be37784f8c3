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

import os
import queue
import signal
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.collate import allocating_into
from stoker.errors import MixedDeviceError
from stoker.fastpaths.batched_getitem import Decline
from stoker.fastpaths.index_tensor import VectorProbe
from stoker.fastpaths.torch_collate_patch import collate_into_slabs_in_this_worker
from stoker.fetch.concurrency import ConcurrencyTuner, RunQueueMeter, declared_thread_safe
from stoker.fetch.fetchers import EMPTY, make_fetcher, vectorisable
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
)
from stoker.sharing.auto_share import apply_in_worker
from stoker.transport import segments
from stoker.transport.segments import SegmentRef
from stoker.transport.slab_writer import SlabPool, SlabWriter, batch_nbytes, write_batch
from stoker.workers import diagnostics
from stoker.workers import protocol as msg
from stoker.workers.remote_errors import RemoteError, capture, describe_indices
from stoker.workers.thread_caps import cap_worker_threads
from stoker.workers.worker_info import set_worker_info

_PARENT_CHECK_INTERVAL_S = 0.5
_MESSAGE = "message"
_EOF = "eof"


def _main_alive(main_pid: int, first_ppid: int) -> bool:
    # Under fork the main process is our parent; under spawn/forkserver the parent may be a
    # server process, so also ask whether the main pid still exists.
    if os.getppid() != first_ppid:
        return False
    try:
        os.kill(main_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _watch_parent(main_pid: int) -> None:
    """Exit when the main process is gone, even if the user's code is stuck in a fetch."""
    first_ppid = os.getppid()
    stop = threading.Event()
    while not stop.wait(_PARENT_CHECK_INTERVAL_S):
        if not _main_alive(main_pid, first_ppid):
            os._exit(0)


def _read_socket(conn: Connection, events: queue.SimpleQueue) -> None:
    while True:
        try:
            message = msg.recv_from_main(conn)
        except (EOFError, OSError):
            events.put((_EOF, None))
            return
        events.put((_MESSAGE, message))
        if isinstance(message, msg.Stop):
            return


class _Collated:
    """A batch that is already collated (vectorised fetch): ``_finish`` only packs it."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


class _Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.epoch = spec.first_epoch
        self.retired: list[int] = []
        self.exhausted = False
        self.init_error: RemoteError | None = None
        self.pool = SlabPool(self._announce, spec.max_idle_slabs, spec.slabs)
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.fetcher: Any = None
        self.tuner: ConcurrencyTuner | None = None
        # NOTE [ Seeds set in worker_init_fn stay ]: False once worker_init_fn seeded them.
        self.seed_per_batch = spec.seed_per_batch
        self.dataset_rngs = find_dataset_rngs(spec.fetch.dataset) if spec.seed_per_batch else []
        self._events_sent = 0
        self.vector: VectorProbe | None = None
        self._reader_started = False
        self.pipeline: SamplePipeline | None = None
        self.inbox: deque[tuple[str, Any]] = deque()  # NOTE [ Idle workers take queued tasks ]
        self.run_queue = RunQueueMeter()  # this (the main) thread: where batches are fetched

    def _announce(self, fd: int, ref: SegmentRef) -> None:
        msg.send(self.conn, msg.Slab(ref))
        if ref.name is None:
            segments.send_fd(self.conn, fd)

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
                                      trusted=self.spec.vector_trusted)
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

    def reset(self, epoch: int, released: list[int], datapipe_seed: int | None) -> None:
        self.epoch = epoch
        self.retired += self.pool.release(released)
        self.exhausted = False
        if self.init_error is None:
            try:
                if datapipe_seed is not None:
                    seed_shufflers(self.spec.fetch.dataset, datapipe_seed)
                self._new_fetcher()
            except Exception as exc:
                self.init_error = capture(
                    exc, self.spec.worker_id, "starting an epoch (iter(dataset))"
                )

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
            seed = batch_seed(self.spec.base_seed, self.epoch, task_id)
            seed_global_rngs(seed)
            reseed(self.dataset_rngs, seed)
        # A call with a whole batch only pays for cheap CPU-bound samples: probe it once the
        # tuner has settled at one fetch at a time (an I/O-bound dataset is never called so).
        settled_at_one = not self.tuner.exploring and self.tuner.concurrency == 1
        if self.vector.wants_probe(settled_at_one):
            self._run_probe(task_id, list(indices))
            return
        if self.fetcher.splittable and (self.tuner.concurrency > 1 or self.tuner.exploring):
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
            msg.send(self.conn, msg.Exhausted(self.epoch, task_id))
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
        self._finish(task_id, indices, _Collated(batch), [], timing)

    def _run_batched(self, task_id: int, indices: Any) -> bool:
        """One call for the whole batch, into a slab; False: declined, fetch it the plain way."""
        assert self.vector is not None
        try:
            slab = self.pool.acquire(None)  # sized by the batches before (the probes at least)
        except OSError as exc:  # no slab to be had: this batch fails, the worker goes on
            self._fail(task_id, indices, exc)
            return True
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            with allocating_into(slab):
                batch = self.vector.fetch(list(indices))
        except Decline:
            self.pool.release_one(slab)
            return False
        except Exception as exc:
            self.pool.release_one(slab)
            self._fail(task_id, indices, exc)
            return True
        timing = (time.perf_counter() - t0, time.thread_time() - c0)
        self._finish(task_id, indices, _Collated(batch), [], timing, slab,
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
        if slab is None:
            # Before the first batch the pool cannot know the size: measure the samples, so
            # the batch is collated straight into a slab that fits instead of being copied.
            hint = None if self.pool.sized or data is EMPTY else batch_nbytes(
                data.batch if isinstance(data, _Collated) else data
            )
            if self.pipeline is None and not self.pool.has_free(hint):
                self._read_waiting(None)  # NOTE [ Slabs come back before the next task ]
            try:
                slab = self.pool.acquire(hint)
            except OSError as exc:  # no slab to be had: this batch fails, the worker goes on
                self._fail(task_id, indices, exc)
                return
        try:
            t0 = time.perf_counter()
            with allocating_into(slab):
                batch = data.batch if isinstance(data, _Collated) else self.fetcher.finish(data)
            del data
            t1 = time.perf_counter()
            segment_id, used, payload = write_batch(self.pool, slab, batch)
            t2 = time.perf_counter()
        except Exception as exc:
            self.pool.release_one(slab)
            self._fail(task_id, indices, exc)
            return
        del batch
        assert self.tuner is not None
        starved = self.pipeline is not None and self.pipeline.take_starved_share() > 0.5
        self.tuner.observe(len(indices) if isinstance(indices, list) else 1, used, starved)
        if self.pipeline is not None:
            self.pipeline.set_concurrency(self.tuner.concurrency)
        events = self.tuner.decisions[self._events_sent:]
        self._events_sent += len(events)
        report = msg.BatchReport(
            concurrency=self.tuner.concurrency, fetch_wall_s=timing[0], fetch_cpu_s=timing[1],
            collate_s=t1 - t0, pack_s=t2 - t1, decisions=tuple(events), batched=batched,
            queued_s=self.run_queue.take(),
            gives_back=self.pipeline is None and self.seed_per_batch,
            init_fn_seeded=self.seed_per_batch != self.spec.seed_per_batch, packed_at=t2,
        )
        msg.send(self.conn, msg.Done(
            self.epoch, task_id, segment_id, used, payload, self.retired, skipped, report
        ))
        self.retired = []

    def _fail(self, task_id: int, indices: Any, exc: BaseException) -> None:
        if isinstance(exc, MixedDeviceError) and isinstance(indices, list):
            exc = exc.with_indices(indices)
        err = capture(exc, self.spec.worker_id, "loading " + describe_indices(indices))
        msg.send(self.conn, msg.Failed(self.epoch, task_id, err))

    # -- many samples at once ----------------------------------------------------------------

    def _pipeline(self) -> SamplePipeline:
        if self.pipeline is None:
            self.pipeline = SamplePipeline(self.fetcher, self.events, self.spec.base_seed)
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

    def _next_event(self) -> tuple[str, Any]:
        """The next socket message or fetch-thread event.

        While every fetch runs on this thread, messages are read straight from the socket; once
        fetch threads exist, a reader thread feeds both into one queue (a message must not wait
        behind a slow fetch, nor a finished sample behind a blocking read).
        """
        if self.inbox:  # read ahead by ``_read_waiting``
            return self.inbox.popleft()
        if self.pipeline is None:
            return self._recv()
        if not self._reader_started:
            self._reader_started = True
            reader = threading.Thread(
                target=_read_socket, args=(self.conn, self.events), daemon=True
            )
            reader.start()
        return self.events.get()

    def _recv(self) -> tuple[str, Any]:
        try:
            return _MESSAGE, msg.recv_from_main(self.conn)
        except (EOFError, OSError):
            return _EOF, None

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

    def _read_waiting(self, task_id: int | None) -> bool:
        """Read what is already waiting in the socket; True if the main process took
        ``task_id`` back. Tasks read ahead that it took back are answered here, and slabs
        it gave back are free at once; the rest waits in ``inbox``."""
        withdrawn = False
        while self.conn.poll():
            event = self._recv()
            item = event[1]
            if event[0] == _MESSAGE and isinstance(item, (msg.Release, msg.Task)):
                # Slabs given back are free now, also those riding with a task read ahead.
                self.retired += self.pool.release(item.released)
                if isinstance(item, msg.Release):
                    continue
                event = (_MESSAGE, item._replace(released=[]))
            if event[0] != _MESSAGE or not isinstance(item, msg.Cancel):
                self.inbox.append(event)
                if event[0] == _EOF:
                    break
                continue
            if (item.epoch, item.task_id) == (self.epoch, task_id):
                withdrawn = True
            else:
                self._withdraw_read_ahead(item.epoch, item.task_id)
        return withdrawn

    def _withdraw_read_ahead(self, epoch: int, task_id: int) -> None:
        for event in self.inbox:
            item = event[1]
            if event[0] == _MESSAGE and isinstance(item, msg.Task) and (
                    item.epoch, item.task_id) == (epoch, task_id):
                self.inbox.remove(event)  # its slabs were released when it was read
                msg.send(self.conn, msg.Cancelled(epoch, task_id))
                return

    def serve(self) -> None:
        while True:
            kind, item = self._next_event()
            if kind == SAMPLE_DONE:
                assert self.pipeline is not None
                if self.pipeline.sample_done(item):
                    self.job_done(item)
                continue
            if kind == JOB_READY:
                self.job_done(item)
                continue
            if kind == _EOF:
                return  # the main process is gone
            if isinstance(item, msg.Task):
                self.retired += self.pool.release(item.released)
                if item.epoch != self.epoch:
                    continue
                if self.pipeline is None and self._read_waiting(item.task_id):
                    msg.send(self.conn, msg.Cancelled(item.epoch, item.task_id))
                    continue
                self.run_task(item.task_id, item.indices)
            elif isinstance(item, msg.Cancel):
                continue  # started or answered already: its reply stands
            elif isinstance(item, msg.Release):
                self.retired += self.pool.release(item.released)
            elif isinstance(item, msg.Reset):
                self.reset(item.epoch, item.released, item.datapipe_seed)
            else:
                return


def worker_main_once(handle: Any, worker_id: int, conn: Connection) -> None:
    """Entry point of a spawn/forkserver worker whose spec was pickled once for all workers
    (NOTE [ Pickle once ] in ``stoker.workers.spec_once``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        spec = handle.load(worker_id)
    except Exception as exc:  # e.g. a __setstate__ that raises: the user gets this error
        doing = "unpickling the dataset and the loader's functions"
        _answer_with(capture(exc, worker_id, doing), conn)
        return
    worker_main(spec, conn)


def _answer_with(error: RemoteError, conn: Connection) -> None:
    """A worker whose spec did not load answers every task with the error until stopped."""
    try:
        msg.send(conn, msg.Hello(has_log=False))
        while True:
            message = msg.recv_from_main(conn)
            if isinstance(message, msg.Task):
                msg.send(conn, msg.Failed(message.epoch, message.task_id, error))
            elif isinstance(message, msg.Stop):
                return
    except (EOFError, OSError):
        return
    finally:
        conn.close()


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process."""
    # Ctrl-C goes to the whole process group; the main process handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    segments.close_inherited()
    from stoker.workers import launch as process_pool

    process_pool.close_inherited_parent_ends()
    threading.Thread(target=_watch_parent, args=(spec.parent_pid,), daemon=True).start()
    cap_worker_threads(1, forked=spec.forked)
    if spec.fetch.fast_paths:
        collate_into_slabs_in_this_worker()  # NOTE [ torch's collate in stoker workers ]
    apply_in_worker(spec.shared_lists)  # before any user code runs here
    worker = _Worker(spec, conn)
    try:
        log_fd = diagnostics.install_in_worker()
        msg.send(conn, msg.Hello(has_log=log_fd is not None))
        if log_fd is not None:
            segments.send_fd(conn, log_fd)
        worker.start()
        worker.serve()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    finally:
        if os.environ.get("STOKER_DEBUG_TUNER") and worker.tuner is not None:
            for d in worker.tuner.decisions:
                print(f"worker {spec.worker_id}: {d}", flush=True)
        if worker.pipeline is not None:
            worker.pipeline.close()
        worker.pool.close()
        conn.close()
