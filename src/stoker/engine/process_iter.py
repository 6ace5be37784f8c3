"""num_workers>0: tasks go to worker processes, batches come back through shared memory.

Ordering follows torch exactly. With ``in_order=True`` batches are yielded in sampler order.
Each task goes round-robin to the next worker still running, as torch sends them, so the
worker that loads a batch (``get_worker_info().id``) is torch's; for an IterableDataset its
data depends on it, and a worker's end is announced once; its later tasks are skipped. Under
the default ``seeding="per_batch"`` a batch does not depend on its worker, so a worker left
idle while another is stuck on a slow batch takes a task still queued behind it (NOTE [ Idle
workers take queued tasks ] in ``workers.main_loop``; NOTE [ Only stragglers move ] in
``engine.stragglers``).
``prefetch_factor * num_workers`` tasks are sent at the start (more for small batches or
concurrent fetches, see NOTE [ Deeper prefetch for small batches ]); one new task is sent per
batch yielded. A task's id is its position in the epoch's sampler order (see NOTE [ Resume
state ]).

NOTE [ A dataset's epoch on persistent workers ]
Persistent workers keep the copy of the dataset pickled when they started, so a
``dataset.set_epoch(n)`` in the main process never reaches them: under torch's DataLoader an
epoch-aware iterable repeats its first epoch's order, and a resume (which starts fresh workers
at the saved epoch) reads another order than the epoch it resumes. A dataset that defines
``stoker_epoch()`` (stoker's ``TarShardStream``) has its main copy's value given to each
worker's ``set_epoch`` with every new epoch (``Reset``). Others are left as torch leaves them.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from torch.utils.data import IterableDataset
from torch.utils.data import dataloader as torch_dataloader

from stoker._core.dataset_hooks import (
    SupportsEpoch,
    SupportsFetchForBatch,
    SupportsFetchForStream,
    provided,
)
from stoker._core.forked_copies import say_as_torchs_copy
from stoker._core.plan import Plan
from stoker._core.process_exit import at_exit
from stoker._core.torch_modes import unseen
from stoker.engine.cuda_safety import safe_context
from stoker.engine.dispatch import Dispatch
from stoker.engine.loader_state import EngineState
from stoker.engine.main_gathers import DEATH_CHECK_EVERY, Gathered, MainGathers, handed_out
from stoker.engine.prefetch_depth import depth_for
from stoker.engine.stats import UNPACK, stage_range
from stoker.engine.worker_death import DeathWatch
from stoker.engine.worker_group import StallClock, StreamLog, WorkerGroup
from stoker.engine.worker_start import start_workers, worker_specs
from stoker.engine.worker_streams import WorkerStreams, is_lightning_init_fn, resume_entries
from stoker.fastpaths.switch import tell_not_per_sample
from stoker.fetch.fetchers import EmptyBatch
from stoker.sampling.fast_batches import draws_unseen_by_workers
from stoker.transport.torch_way import Unpickled
from stoker.workers import protocol as msg
from stoker.workers.launch import WorkerProcess, default_context
from stoker.workers.remote_errors import rebuild

_EMPTY_STEP = object()
_LIVENESS_POLL_S = 5.0
_WATCH_DELAY_S = 1.0  # only a fallback: worker sentinels wake the wait at once on death


def _dataset_epoch(dataset: Any) -> int | None:
    """NOTE [ A dataset's epoch on persistent workers ]."""
    epoch_of = provided(dataset, SupportsEpoch.stoker_epoch)
    return epoch_of() if callable(epoch_of) else None




def _worker_id(by_fd: dict[int, Any], fd: int) -> int | None:
    w, _ = by_fd.get(fd, (None, False))
    return None if w is None else w.worker_id


class ProcessIterator(Dispatch, torch_dataloader._MultiProcessingDataLoaderIter):
    """Conducts one loader's workers: ``Dispatch`` sends their tasks, ``TaskBook`` says which
    task is where, ``WorkerGroup`` owns the processes and sockets, ``MovePolicy`` moves tasks
    off stragglers, ``DeathWatch`` and ``StallClock`` report dead and stuck workers."""

    _reiter_after_seed = True

    def _fresh_worker_batches(self) -> list[int] | None:
        # The iterator's own worker count, as torch's persistent iterator keeps it: a
        # num_workers set on the loader since counts from its next new iterator only.
        if isinstance(self._dataset, IterableDataset):
            return [0] * self._num_workers
        return None

    def __init__(
        self, plan: Plan, engine: EngineState, resume: dict[str, Any] | None = None
    ) -> None:
        try:
            super().__init__(plan, engine, resume)  # draws the base seed first, as torch's does
        except BaseException:
            self._half_built = True  # NOTE [ torch's half-built iterator ]
            raise
        # An int with workers (torch's constructor sets 2; _check_before_reiter refuses < 1).
        self._prefetch: int = plan.prefetch_factor  # type: ignore[assignment]
        self._in_order = plan.in_order
        self._persistent = plan.persistent_workers
        self._is_iterable = self._fetch_spec.kind == "iterable"
        # Which worker loads a batch changes nothing only if batches are seeded by position;
        # else (an iterable's data, and under seeding="per_worker" a batch's augmentations,
        # depend on the worker) no task moves and workers keep torch's depth. Even then a
        # program can tell (get_worker_info().id, the order of side effects): each is beyond
        # torch, asked for by name (NOTE [ Same as torch unless asked ]).
        by_position = not self._is_iterable and self._seeding == "per_batch"
        beyond = self._fetch_spec.beyond
        self._torch_depth = not (by_position and "deep_prefetch" in beyond)
        self._may_move = by_position and "move_stragglers" in beyond and self._num_workers > 1
        self._stall = StallClock(self._timeout, plan.stall_warning_s)
        self._step_samples = plan.batch_size or 1
        ctx = safe_context(plan.multiprocessing_context, default_context(), plan)
        self._group = WorkerGroup(self._num_workers)
        self._group.reader.pins = self._host_pins()  # NOTE [ Slabs pinned in place ]
        self._finalizer = weakref.finalize(self, self._group.stop)  # stop() checks its process
        self._deaths = DeathWatch(self._group, self._finalizer)
        # A worker that adopts the batched form read from the source vouches for it: the next
        # epoch's workers use it without probe batches, as the inline iterator does.
        self._vector_trusted = self._engine.vector_trusted is self._dataset
        # Whether each worker's last reply said it can give a queued task back. Before the
        # first one: yes (it starts with no fetch threads), unless a worker_init_fn may have
        # taken over its seeds (NOTE [ Seeds set in worker_init_fn stay ]). Assuming no let
        # an idle worker exit while a task still queued behind a straggler could move to it.
        self._gives_back = [plan.worker_init_fn is None] * self._num_workers
        # A dataset may ask to see each batch here as it is sent (an iterable one: the samples
        # asked of the worker so far), e.g. to download what the worker will read
        # (stoker.formats.TarShards, TarShardStream); the samples do not change.
        self._fetch_for_batch = None if self._is_iterable else provided(
            self._dataset, SupportsFetchForBatch.stoker_fetch_for_batch)
        self._fetch_for_stream = provided(
            self._dataset, SupportsFetchForStream.stoker_fetch_for_stream
        ) if self._is_iterable else None
        self._init_streams(plan, resume)  # NOTE [ Worker streams resume ]
        self._init_dispatch()
        if resume and not self._is_iterable:  # continue torch's round-robin where it stopped
            self._book.start_turn_at(resume["batches"])
        cursor = self._cursor
        specs = worker_specs(plan, ctx, self._group, self._engine, base_seed=cursor.base_seed,
                             first_epoch=cursor.epoch, datapipe_seed=cursor.datapipe_seed,
                             vector_trusted=self._vector_trusted, resume=self._resume_entries)
        # NOTE [ Gathers read the workers' starting copy ]: copied where the workers copy it
        self._main_gathers = MainGathers.for_loader(
            self._fetch_spec, plan.worker_init_fn, self._fetch_for_batch is not None,
            ctx.get_start_method())
        try:
            start_workers(self._group, ctx, specs, self._prime)
        finally:
            self._group.feeders.all_started()
        self._worker_pids = tuple(p for p in self._group.pids if p is not None)  # all started
        cursor.reiter()  # NOTE [ The sampler's second pass ]: torch's first _reset
        self._memory_watch = self._engine.memory_watch
        # Its first reads cost ~10 ms each: keep them out of the time to the first batch.
        self._watch_from = time.monotonic() + _WATCH_DELAY_S
        self._fill()

    def _reiter_later(self, plan: Plan) -> bool:
        # NOTE [ The sampler's second pass ]: before the forks only where they are primed
        return not draws_unseen_by_workers(plan.index_sampler)

    def _check_before_reiter(self, plan: Plan) -> None:
        # torch's check, its comparison (None, left by a constructor without workers, fails
        # with torch's TypeError) and its message, where torch makes it
        if plan.prefetch_factor <= 0:  # type: ignore[operator]
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")

    # -- each worker's own streams (NOTE [ Worker streams resume ]) ----------------------------

    def _init_streams(self, plan: Plan, resume: dict[str, Any] | None) -> None:
        kind, n = self._fetch_spec.kind, self._num_workers
        self._lightning_init_fn = is_lightning_init_fn(plan.worker_init_fn)
        self._stream_log = StreamLog(n, kind)
        self._resume_entries = tuple(resume_entries(resume, n)) if resume else ()
        streams = self._cursor.progress.streams = WorkerStreams.resumed(kind, n, resume)
        # weakly: the loader keeps the last epoch's progress, and must not keep this iterator
        streams.await_starts = weakref.WeakMethod(self._await_worker_starts)

    def _await_worker_starts(self) -> None:
        """Read replies until every worker start a state needs has arrived."""
        progress = self._cursor.progress
        while progress.streams.missing(progress.finished) and not self._group.stopped:
            self._receive()

    def reset(self, plan: Plan) -> None:
        """Next epoch on persistent workers (called by ``DataLoader.__iter__``; torch's
        ``_reset``): of the new pass's ``plan`` only the epoch's facts are read."""
        # Batches of the abandoned epoch that arrived but were never handed out: their slabs
        # go back to the workers (else each early-ended epoch would strand a few slabs).
        for wid, reply in self._book.ready.values():
            if isinstance(reply, msg.Done):
                self._group.reader.release_now(wid, reply.segment_id)
        ended = self._cursor.progress
        self._open_epoch(plan, None, first=False)
        self._cursor.progress.streams = ended.streams.next_epoch(ended.finished)
        self._group.collect_released()
        cursor = self._cursor
        for w in self._group.workers:
            release = self._group.take_release(w.worker_id)
            self._send(w.worker_id, msg.Reset(cursor.epoch, release, cursor.datapipe_seed,
                                              _dataset_epoch(self._dataset)))
        self._init_dispatch()
        self._fill()
        # torch's _reset waits for every worker's answer: a dead one is raised here, at iter()
        # (a failed send leaves it to the next wait: NOTE [ A worker that exited with code 0 ])
        self._deaths.check(self._book, self._file_reply)

    # -- receiving ---------------------------------------------------------------------------

    def _next_data(self) -> Any:
        while True:
            item = self._book.next_ready()
            if item is not None:
                wid, reply = item
                if type(reply) is Gathered:  # off its worker's load before the next task is
                    self._book.load[wid] -= 1  # placed, as a reply is once it has arrived
                self._try_put_index()
                if type(reply) is Gathered:
                    return self._deliver_gathered(wid, reply)
                if self._cursor.dropped(reply.task_id, wid):  # re-read after an iterable resume
                    if isinstance(reply, msg.Done):
                        self._group.reader.release_now(wid, reply.segment_id)
                    continue
                data = self._deliver(wid, reply)
                if data is _EMPTY_STEP:  # every sample of it was skipped
                    self._skips.empty_step(reply.task_id, self._index_sampler)
                    continue
                return data
            if not self._book.outstanding():
                self._end_epoch()
                raise StopIteration
            try:
                self._receive()
            except Exception:
                if at_exit():  # NOTE [ A daemon thread's loader at exit ]
                    threading.Event().wait()
                raise

    # NOTE [ A daemon thread's loader at exit ]
    # A loop in a daemon thread may still wait for a batch when the program's last line has
    # run. At exit the workers are ended (NOTE [ Workers at interpreter exit ]), and torch's
    # thread, blocked on its queue, never wakes before the process is gone: nothing printed,
    # exit code 0. stoker's would wake at once, its worker's socket closed, and raise (a
    # WorkerDiedError, a closed handle) into threading's excepthook, which prints it. So an
    # error while waiting, once the interpreter is at exit (only a daemon thread still runs
    # Python then), parks the thread instead, as torch's is parked.

    def _send_large_releases(self) -> None:
        """NOTE [ Slabs come back before the next task ] in ``engine.worker_group``."""
        for wid in self._group.large_releases():
            self._send(wid, msg.Release(self._group.take_release(wid)))

    def _receive(self) -> None:
        """Block until some worker replies (or dies, or the timeout passes); file the replies."""
        self._group.collect_released()
        self._send_large_releases()  # before waiting: the worker may need the slab first
        poller, by_fd = self._group.poller()
        wait_s = self._stall.wait_s(_LIVENESS_POLL_S)
        # wake up to move a queued task
        due = self._moves.due(self._idle_workers()) if self._may_move else None
        until_due = wait_s if due is None else max(0.0, due - time.monotonic())
        move_wakeup = until_due < wait_s
        wait_s = min(wait_s, until_due)
        ready = poller.poll(max(0, int(wait_s * 1000 + 0.999)))
        got_reply = False
        # torch's loop takes batches off its queue only until the one it waits for comes, and
        # rebuilds each as it takes it (under the program's modes at that next()): the awaited
        # worker's message first, and none after the awaited batch is in
        awaited = self._book.awaited_worker()
        for fd, _ in sorted(ready, key=lambda r: _worker_id(by_fd, r[0]) != awaited):
            w, is_conn = by_fd.get(fd, (None, False))  # gone if it was let go meanwhile
            if w is not None and is_conn:
                try:  # one message: the caller polls again for the rest
                    self._file(w, msg.recv_from_worker(w.conn, self._unpacking, w.reused))
                except (EOFError, OSError):
                    self._deaths.lost(self._book, w, self._file_reply)
                got_reply = True
                if self._book.awaited_ready():
                    break
        if self._may_move and (got_reply or move_wakeup):
            self._move_queued_tasks()
        if not got_reply:
            self._deaths.check(self._book, self._file_reply)
            if not ready and self._timeout > 0 and not move_wakeup:
                self._stall.timed_out(self._group, self._book)
            self._stall.check(self._group, self._book)

    def _file(self, w: Any, message: msg.FromWorker) -> None:
        reply = self._group.file_control(w, message)
        if reply is not None:
            self._file_reply(w, reply)

    def _file_reply(self, w: Any, message: msg.Reply | msg.Started) -> None:
        cursor = self._cursor
        reply = self._stream_log.file(w.worker_id, message, cursor.epoch, cursor.progress.streams)
        if reply is None:
            return  # a Started, filed (NOTE [ Worker streams resume ])
        done = reply if isinstance(reply, msg.Done) else None
        if done is not None and done.retired:
            self._group.reader.retire(w.worker_id, done.retired)
            w.reused.drop(done.retired)  # no slabs: NOTE [ torch's shared memory, reused ]
        if reply.epoch != cursor.epoch:  # a reply to an abandoned epoch: recycle its slab
            if done is not None:
                self._group.reader.release_now(w.worker_id, done.segment_id)
            return
        wid, position, book = w.worker_id, reply.task_id, self._book
        if done is not None and isinstance(done.payload, Unpickled):
            self._stats.unpacked(time.perf_counter() - done.payload.seconds)
        elif done is not None and done.segment_id is None:
            # Unpickled now, as torch's loop does when a batch arrives (batches with fds are,
            # as they are received: NOTE [ Batches cross as torch's do ]).
            try:
                batch = Unpickled(self._unpack(wid, done))
            except Exception as exc:
                batch = Unpickled(None, exc)
            reply = done = done._replace(payload=batch)
        now = time.monotonic()
        if book.answered(wid, position) and self._may_move:
            self._moves.watch.finished(wid, now)
        self._stall.replied(now)
        if position in book.moved and self._settle_moved(wid, reply):
            if book.sampler_done:
                self._let_idle_workers_go()
            return
        if isinstance(reply, msg.Exhausted):
            book.exhausted(wid, position)
            self._try_put_index()
            self._let_idle_workers_go()
            return
        if done is not None:
            self._gives_back[wid] = done.report.concurrency == 1 and done.report.gives_back
            if done.report.init_fn_seeded:
                self._cursor.progress.streams.init_fn_seeded = True
                self._engine.warn_init_fn_seeds_once(self._lightning_init_fn)
        if book.sampler_done:
            self._let_idle_workers_go()
        book.file(wid, position, reply)
        if done is not None and (not self._torch_depth or done.report.concurrency > 1):
            depth = depth_for(self._prefetch, self._step_samples, done.report.concurrency,
                              done.report.nbytes, small_batches=not self._torch_depth)
            if depth != book.depth[wid]:
                book.depth[wid] = depth
                self._fill()

    def _settle_moved(self, wid: int, reply: msg.Reply) -> bool:
        """A reply for a moved task: True if it is not the batch (a withdrawal, or the copy
        that came second; its slab goes back)."""
        withdrawn = isinstance(reply, msg.Cancelled)
        if not self._book.settle_moved(wid, reply.task_id, withdrawn):
            return False  # the first copy
        if not withdrawn:
            self._stats.tasks_loaded_twice += 1
            if isinstance(reply, msg.Done):
                self._group.reader.release_now(wid, reply.segment_id)
        return True

    def _deliver(self, wid: int, reply: msg.Done | msg.Failed) -> Any:
        position = reply.task_id
        self._book.indices.pop(position, None)
        self._cursor.delivered(position, wid, reply.rngs)
        if isinstance(reply, msg.Failed):
            raise rebuild(reply.error)
        self._stats.worker_batch(wid, reply.report)
        if reply.report.batched:  # NOTE [ One switch for the fast paths ]
            tell_not_per_sample(self._dataset, reply.report.batched)
        if reply.report.batched == "source" and not self._vector_trusted:
            self._vector_trusted = True
            self._engine.vector_trusted = self._dataset
        if reply.skipped:
            self._skips.record(reply.skipped)
        payload = reply.payload
        if isinstance(payload, Unpickled) and payload.error is not None:
            self._lost_with_worker(wid, payload.error)
        data = payload.batch if isinstance(payload, Unpickled) else self._unpack(wid, reply)
        if self._memory_watch is not None and time.monotonic() > self._watch_from:
            self._memory_watch.sample(self._worker_pids)
        if isinstance(data, EmptyBatch):
            return _EMPTY_STEP
        return self._pinned(data)

    def _deliver_gathered(self, wid: int, reply: Gathered) -> Any:
        """NOTE [ Gathers read the workers' starting copy ]."""
        position = reply.task_id
        self._book.indices.pop(position, None)
        self._cursor.delivered(position, wid)
        self._stats.gathered_here()
        tell_not_per_sample(self._dataset, "torch")
        gathers = self._main_gathers
        if gathers is not None and gathers.count % DEATH_CHECK_EVERY == 0:
            self._deaths.check(self._book, self._file_reply)  # the wait that would see it
        if self._memory_watch is not None and time.monotonic() > self._watch_from:
            self._memory_watch.sample(self._worker_pids)
        batch, reply.batch = reply.batch, None  # its storages held by the handed-out tensors
        # torch's pin thread rebuilds a batch where the program's modes are not
        with unseen(self._pin, recorded=True):
            batch = handed_out(batch)
        return self._pinned(batch)

    def _lost_with_worker(self, wid: int, error: Exception) -> None:
        """A batch that could not be unpickled: if its worker died (under torch's
        ``file_system`` strategy its shared memory may go with it), report the death (what it
        was loading when it died); else the error itself."""
        w = next((w for w in self._group.workers if w.worker_id == wid), None)
        if w is not None and isinstance(error, OSError):
            w.process.join(1.0)
            if w.process.exitcode is not None:
                self._deaths.lost(self._book, w, self._file_reply)
        try:
            raise error
        finally:  # no cycle through this frame (the iterator goes with the traceback)
            del error

    def _unpacking(self) -> Any:
        """stoker's receive range (NOTE [ Batches cross as torch's do ]), where asked for."""
        return stage_range(UNPACK, self._ranges)

    def _unpack(self, wid: int, done: msg.Done) -> Any:
        assert isinstance(done.payload, bytes)
        t0 = time.perf_counter()
        # torch's pin thread rebuilds a batch where the program's modes are not: NOTE [ The
        # program's torch modes see torch's calls ]
        with stage_range(UNPACK, self._ranges), unseen(self._pin, recorded=True):
            data = self._group.reader.unpack(wid, done.segment_id, done.used, done.payload)
        self._stats.unpacked(t0)
        return data

    # -- ending ------------------------------------------------------------------------------

    def _end_epoch(self) -> None:
        if not self._persistent:
            self.shutdown()
            self._main_gathers = None  # the copy goes with the workers it stood for
            return
        if self._main_gathers is not None:
            self._main_gathers.segments.end_epoch()
        for w in self._group.workers:  # NOTE [ torch's shared memory, reused ]
            if not w.stop_sent:
                self._group.collect_released()
                ids = self._group.take_release(w.worker_id, settle=False)
                try:  # a worker that died is reported at the next epoch, as before
                    msg.send(w.conn, msg.Release(ids + w.reused.end_epoch(), True))
                except OSError:
                    pass

    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""
        self._finalizer()

    def _shutdown_workers(self) -> None:  # torch's name, for code that calls it
        self.shutdown()

    # NOTE [ torch's half-built iterator ]
    # torch's _MultiProcessingDataLoaderIter sets ``_shutdown`` only after its base class's
    # __init__ (the sampler's iter(), the base seed, the pin_memory warning): when that raises,
    # the half-built iterator's __del__ fails reading ``_shutdown``, and the interpreter prints
    # "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ ...>" with its
    # AttributeError when the object goes (a program that caught the error goes on, and that
    # is what its stderr shows). The same object of torch's class is made and dropped here, so
    # the interpreter prints torch's own report, from torch's frames, at the same moment.

    def __del__(self) -> None:
        # not torch's: the finalizer stops the workers, also when __init__ failed
        if self.__dict__.get("_half_built"):
            object.__new__(torch_dataloader._MultiProcessingDataLoaderIter)
            return
        finalizer = self.__dict__.get("_finalizer")
        if finalizer is not None:
            group = self._group
            if group.running_when_copied:
                # NOTE [ A forked copy of a live iterator says what torch's says ]
                say_as_torchs_copy([w.process for w in group.workers])
            finalizer()  # the workers stop first, as torch's __del__ shuts them down first
            plan = self._plan
            # NOTE [ What the iterator lets go of ]: torch's attributes' order
            self._let_go_in_order(plan.dataset, plan.index_sampler, plan.fetch.collate_fn,
                                  self._cursor.sampler_iter, plan.worker_init_fn)

    @property
    def _workers(self) -> list[WorkerProcess]:  # type: ignore[override]
        """torch's name: the worker processes (code reads their pids or joins them)."""
        return [WorkerProcess(w) for w in self._group.workers]

    @property
    def stopped(self) -> bool:
        return self._group.stopped
