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
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import warnings
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.engine.base_iter import BaseIterator
from stoker.engine.cuda_safety import refuse_device_tensors, safe_context
from stoker.engine.shutdown import WorkerGroup
from stoker.engine.stall import describe_stall, warn_stall
from stoker.engine.stragglers import StragglerWatch
from stoker.engine.worker_death import check_workers_alive, lost_worker
from stoker.errors import LoaderTimeoutError
from stoker.fastpaths.batched_getitem import compile_batched
from stoker.fetch.fetchers import EmptyBatch, vectorisable
from stoker.profile.ranges import UNPACK, stage_range
from stoker.sampling.datapipes import distributed_settings, is_datapipe
from stoker.workers import protocol as msg
from stoker.workers.launch import (
    WorkerProcess,
    default_context,
    gc_frozen_for_fork,
    start_worker,
)
from stoker.workers.remote_errors import add_note, rebuild
from stoker.workers.spec_once import PickledSpec
from stoker.workers.thread_caps import pools_quiet_for_fork

_EMPTY_STEP = object()

# NOTE [ Deeper prefetch for small batches ]
# torch keeps prefetch_factor tasks per worker; a worker that has finished them idles until
# the main process yields a batch, and with in-order delivery that waits for the slowest
# worker. On a busy machine this left tiny-batch workers idle a third of the time. When
# batches are small, that depth costs almost no memory, so a worker may hold up to
# _SMALL_BATCH_DEPTH tasks as long as they fit in _SMALL_BATCH_BUDGET bytes. prefetch_factor
# stays the floor (and the exact depth for larger batches); results do not change.
_SMALL_BATCH_DEPTH = 8
_SMALL_BATCH_BUDGET = 16 << 20
# NOTE [ Slabs come back before the next task ]
# A slab the user let go of travels back to its worker with that worker's next task. A worker
# whose next task is already queued may finish it before another task comes, find every slab
# still out, and create one: ~8 ms for a 10 MiB slab (the kernel zeroes its pages), plus the
# memory. So while the main process waits for a batch (the workers are the bottleneck then),
# released slabs of at least _EAGER_RELEASE_BYTES go back at once, in a RELEASE message of
# their own, and a worker about to create a slab first reads what is waiting in its socket.
# Smaller slabs are cheap to create and keep riding with tasks, as do all slabs when batches
# are ready before they are asked for: a message per batch would cost more than it saves.
_EAGER_RELEASE_BYTES = 1 << 20
_LIVENESS_POLL_S = 5.0
_WATCH_DELAY_S = 1.0  # only a fallback: worker sentinels wake the wait at once on death


class ProcessIterator(BaseIterator):
    _reiter_after_seed = True

    def __init__(self, loader: Any, resume: dict[str, Any] | None = None) -> None:
        super().__init__(loader, resume)
        self._prefetch = loader.prefetch_factor
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        self._is_iterable = self._fetch_spec.kind == "iterable"
        # Which worker loads a batch changes nothing only if batches are seeded by position;
        # else (an iterable's data, and under seeding="per_worker" a batch's augmentations,
        # depend on the worker) no task moves and workers keep torch's depth.
        self._torch_depth = self._is_iterable or self._seeding != "per_batch"
        self._may_move = not self._torch_depth and self._num_workers > 1
        self._stall_warning_s = loader.stall_warning_s
        self._step_samples = loader.batch_size or 1
        refuse_device_tensors(self._dataset, self._num_workers)
        ctx = safe_context(loader.multiprocessing_context, default_context(), loader)
        self._group = WorkerGroup()
        self._group.reader.pins = self._host_pins()  # NOTE [ Slabs pinned in place ]
        self._finalizer = weakref.finalize(self, self._group.stop)
        # A worker that adopts the batched form read from the source vouches for it: the next
        # epoch's workers use it without probe batches, as the inline iterator does.
        self._loader_ref = weakref.ref(loader)
        self._vector_trusted = loader._stoker_vector_trusted is self._dataset
        method = ctx.get_start_method()
        # Whether each worker's last reply said it can give a queued task back. Before the
        # first one: yes (it starts with no fetch threads), unless a worker_init_fn may have
        # taken over its seeds (NOTE [ Seeds set in worker_init_fn stay ]). Assuming no let
        # an idle worker exit while a task still queued behind a straggler could move to it.
        self._gives_back = [loader.worker_init_fn is None] * self._num_workers
        self._init_dispatch()
        with pools_quiet_for_fork(method), gc_frozen_for_fork(method):
            self._start_workers(loader, ctx)
        self._worker_pids = tuple(w.pid for w in self._group.workers)
        self._memory_watch = loader._stoker_memory_watch
        # Its first reads cost ~10 ms each: keep them out of the time to the first batch.
        self._watch_from = time.monotonic() + _WATCH_DELAY_S
        self._fill()

    def _start_workers(self, loader: Any, ctx: Any) -> None:
        # Under fork, large plain lists go to the workers as shared containers (NOTE
        # [ Automatic list sharing ]); spawned workers get the pickled dataset anyway.
        fork = ctx.get_start_method() == "fork"
        shared = loader._stoker_list_sharing.plan(self._dataset) if fork else ()
        if fork and vectorisable(self._fetch_spec):
            compile_batched(self._dataset)  # cached: forked workers inherit it
        specs = [self._spec(loader, wid, shared) for wid in range(self._num_workers)]
        if fork:  # NOTE [ Slabs outlive workers ]
            self._group.bank = loader._stoker_slab_bank
            specs = [self._forked_spec(s) for s in specs]
        if fork or len(specs) == 1:
            for spec in specs:
                self._group.workers.append(start_worker(ctx, spec))
                self._prime(spec.worker_id)  # NOTE [ Tasks before the next fork ]
            return
        # spawn/forkserver: the spec is pickled once for all workers (NOTE [ Pickle once ]);
        # each child imports torch and unpickles, seconds each, so start them side by side
        # (a fork must not happen in a thread).
        once = PickledSpec(specs[0])
        try:
            with ThreadPoolExecutor(max_workers=min(len(specs), 8)) as pool:
                futures = [pool.submit(start_worker, ctx, spec, once) for spec in specs]
        finally:
            once.close()
        # Keep every worker that started (shutdown stops them), then report a failed start.
        self._group.workers.extend(f.result() for f in futures if f.exception() is None)
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            raise failed[0]  # type: ignore[misc]

    def _spec(self, loader: Any, wid: int, shared_lists: tuple = ()) -> WorkerSpec:
        return WorkerSpec(
            worker_id=wid,
            num_workers=self._num_workers,
            fetch=self._fetch_spec,
            base_seed=self._base_seed,
            worker_init_fn=loader.worker_init_fn,
            max_idle_slabs=self._prefetch + 2,  # idle slabs kept: memory vs allocations
            parent_pid=os.getpid(),
            first_epoch=self._epoch,
            seed_per_batch=self._seeding == "per_batch",
            dist=loader.dist_context,
            concurrency=loader.worker_concurrency,
            shared_lists=shared_lists,
            vector_trusted=self._vector_trusted,
            datapipe_seed=self._datapipe_seed,
            datapipe_ranks=distributed_settings() if is_datapipe(self._dataset) else None,
        )

    def _forked_spec(self, spec: WorkerSpec) -> WorkerSpec:
        """A forked worker's spec: the slabs its predecessor left (the reader owns them from
        here, so a failed start gives them back to the bank), and ``forked``."""
        assert self._group.bank is not None
        slabs = self._group.bank.withdraw(spec.worker_id)
        for sid, slab in enumerate(slabs):
            self._group.reader.adopt_banked(spec.worker_id, sid, slab)
        return dataclasses.replace(
            spec, slabs=tuple((s.address, s.nbytes) for s in slabs), forked=True
        )

    # -- epoch state -------------------------------------------------------------------------

    # NOTE [ Tasks before the next fork ]
    # Forking a worker costs the main process ~6 ms (its page tables), and workers are forked
    # one after another. Sending tasks only once all were forked left the first worker idle
    # for the forks after it, at the start of every epoch. So each worker of a map-style
    # dataset gets its first task as soon as it is forked; the rest follow after the last fork,
    # in the same order as before (task k to worker k mod n at the start), so which worker
    # loads which batch does not change. An IterableDataset's tasks follow torch's round-robin
    # cycle, which is only walked after every fork.

    def _prime(self, wid: int) -> None:
        if not self._is_iterable and self._load[wid] < min(1, self._depth[wid]) and not (
                self._sampler_done):
            self._try_put_index(wid)

    def _start_dispatch(self) -> None:
        self._init_dispatch()
        self._fill()

    def _fill(self) -> None:
        """Send tasks until every worker holds its depth of them."""
        missing = sum(max(0, d - n) for d, n in zip(self._depth, self._load, strict=True))
        for _ in range(missing):
            if self._sampler_done:
                return
            self._try_put_index()

    def _init_dispatch(self) -> None:
        n = self._num_workers
        self._order: deque[int] = deque()  # dispatched positions, in sampler order
        self._task_worker: dict[int, int] = {}  # outstanding task -> worker
        self._task_indices: dict[int, Any] = {}
        self._ready: dict[int, tuple] = {}  # replies not yet yielded
        self._arrivals: deque[int] = deque()  # completion order, for in_order=False
        self._load = [0] * n
        self._active = [True] * n
        # NOTE [ Idle workers take queued tasks ]: each worker's unanswered tasks in the order
        # sent (the first is running), and moved tasks -> the workers that still owe a reply.
        self._queued: list[deque[int]] = [deque() for _ in range(n)]
        self._stragglers = StragglerWatch(n)
        self._moved: dict[int, set[int]] = {}
        # Tasks a worker may hold: prefetch_factor, or enough to keep its concurrent fetches
        # busy once its tuner raised them (batches of samples in flight + one).
        self._depth = [self._prefetch] * n
        self._to_release: list[list[int]] = [[] for _ in range(n)]
        self._rr = itertools.cycle(range(n))
        self._sampler_done = False
        self._last_reply_at = time.monotonic()
        self._stall_warned = False

    def _reset(self, loader: Any) -> None:
        """Next epoch on persistent workers (called by ``DataLoader.__iter__``)."""
        # Batches of the abandoned epoch that arrived but were never handed out: their slabs
        # go back to the workers (else each early-ended epoch would strand a few slabs).
        for wid, reply in self._ready.values():
            if reply[0] == msg.DONE:
                self._group.reader.release_now(wid, reply[3])
        self._open_epoch(loader, None, first=False)
        self._collect_released()
        for w in self._group.workers:
            release = self._take_release(w.worker_id)
            self._send(w.worker_id, (msg.RESET, self._epoch, release, self._datapipe_seed))
        self._start_dispatch()

    # -- sending -----------------------------------------------------------------------------

    def _send(self, wid: int, message: tuple) -> None:
        w = self._group.workers[wid]
        try:
            w.conn.send(message)
        except OSError:  # EPIPE/ECONNRESET: it died since the last poll; report the death
            lost_worker(self, w)

    def _collect_released(self) -> None:
        for wid, ids in self._group.reader.take_released().items():
            if wid < len(self._group.workers):
                self._to_release[wid].extend(ids)

    def _take_release(self, wid: int) -> list[int]:
        ids, self._to_release[wid] = self._to_release[wid], []
        return ids

    def _let_idle_workers_go(self) -> None:
        """Non-persistent workers with nothing left this epoch (the sampler is spent and
        their tasks are answered, or their iterable ended) exit now, while the last batches
        are consumed, instead of all together at the end of the epoch."""
        if self._persistent:
            return
        for w in self._group.workers:
            wid = w.worker_id
            if not w.stop_sent and (
                not self._active[wid] or (self._sampler_done and self._load[wid] == 0)
            ) and not (self._active[wid] and self._queued_elsewhere()):
                self._group.stop_early(w)

    # -- moving queued tasks to idle workers (NOTE [ Idle workers take queued tasks ]) --------

    def _holds_movable(self, wid: int) -> bool:
        """Does worker ``wid`` hold a task it has not started and could give back?"""
        return self._gives_back[wid] and len(self._queued[wid]) > 1

    def _queued_elsewhere(self) -> bool:
        return self._may_move and any(map(self._holds_movable, range(self._num_workers)))

    def _idle_workers(self) -> list[int]:
        return [
            w.worker_id for w in self._group.workers
            if not w.stop_sent and self._active[w.worker_id] and self._load[w.worker_id] == 0
        ]

    def _move_due(self) -> float | None:
        """The earliest time a queued task may move to an idle worker; None if none can."""
        if not self._queued_elsewhere() or not self._idle_workers():
            return None
        return min(self._stragglers.due(w) for w in range(self._num_workers)
                   if self._holds_movable(w))

    def _move_queued_tasks(self) -> None:
        """Give each idle worker a task queued behind a straggler at another worker."""
        due = self._move_due()
        if due is None or due > time.monotonic():
            return
        self._read_waiting_replies()  # a task that looks queued may be answered already
        for thief in self._idle_workers():
            now = time.monotonic()
            victims = [w for w in range(self._num_workers) if self._holds_movable(w)
                       and self._stragglers.straggling(w, self._group.workers[w].pid, now)]
            if not victims:
                break
            victim = max(victims, key=lambda w: len(self._queued[w]))
            position = self._queued[victim][1]  # the first not started: [0] runs
            del self._queued[victim][1]
            self._send(victim, (msg.CANCEL, self._epoch, position))
            self._moved[position] = {victim, thief}
            self._send_task(thief, position, self._task_indices[position])
            self._stats.tasks_moved += 1
        self._let_idle_workers_go()

    def _read_waiting_replies(self) -> None:
        """File every reply already sent (a dead worker is reported by the next wait)."""
        for w in self._group.workers:
            if not w.stop_sent:
                for reply in self._group.drain(w):
                    self._file_reply(w, reply)

    def _settle_moved(self, wid: int, reply: tuple) -> bool:
        """A reply for a moved task: True if it is not the batch (a withdrawal, or the copy
        that came second; its slab goes back)."""
        position = reply[2]
        owing = self._moved[position]
        owing.discard(wid)
        if not owing:
            del self._moved[position]
        if reply[0] == msg.CANCELLED:
            return True
        if position in self._task_worker:
            return False  # the first copy
        self._stats.tasks_loaded_twice += 1
        if reply[0] == msg.DONE:
            self._group.reader.release_now(wid, reply[3])
        return True

    def _pick_worker(self) -> int | None:
        """torch's cycle: the next active worker (with in_order=False, one below its depth)."""
        for _ in range(self._num_workers):
            wid = next(self._rr)
            if self._active[wid] and (self._in_order or self._load[wid] < self._depth[wid]):
                return wid
        return None

    def _try_put_index(self, wid: int | None = None) -> None:
        """Send the next task to worker ``wid``, or to the one ``_pick_worker`` chooses."""
        if wid is None:
            wid = self._pick_worker()
        if wid is None:
            return
        try:
            position, index = self._next_index()
        except StopIteration:
            self._sampler_done = True
            self._let_idle_workers_go()
            return
        self._order.append(position)
        self._task_indices[position] = index
        self._send_task(wid, position, index)

    def _send_large_releases(self) -> None:
        """NOTE [ Slabs come back before the next task ]"""
        reader = self._group.reader
        for w in self._group.workers:
            ids = self._to_release[w.worker_id]
            if ids and not w.stop_sent and any(
                    reader.nbytes(w.worker_id, sid) >= _EAGER_RELEASE_BYTES for sid in ids):
                self._send(w.worker_id, (msg.RELEASE, self._take_release(w.worker_id)))

    def _send_task(self, wid: int, position: int, index: Any) -> None:
        self._collect_released()
        self._send(wid, (msg.TASK, self._epoch, position, index, self._take_release(wid)))
        self._task_worker[position] = wid
        self._queued[wid].append(position)
        if self._load[wid] == 0:
            self._stragglers.started(wid, time.monotonic())
        self._load[wid] += 1

    # -- receiving ---------------------------------------------------------------------------

    def _next_data(self) -> Any:
        while True:
            item = self._next_ready()
            if item is not None:
                self._try_put_index()
                wid, reply = item
                if self._dropped(reply[2]):  # re-read after an iterable resume
                    if reply[0] == msg.DONE:
                        self._group.reader.release_now(wid, reply[3])
                    continue
                data = self._deliver(wid, reply)
                if data is _EMPTY_STEP:  # every sample of it was skipped
                    continue
                return data
            if not self._task_worker:
                self._end_epoch()
                raise StopIteration
            self._receive()

    def _next_ready(self) -> tuple | None:
        if not self._in_order:
            return self._ready.pop(self._arrivals.popleft()) if self._arrivals else None
        while self._order:
            position = self._order[0]
            if position in self._ready:
                self._order.popleft()
                return self._ready.pop(position)
            wid = self._task_worker.get(position)
            if wid is not None and self._active[wid]:
                return None  # still being worked on
            self._order.popleft()  # its worker's iterable ended: skip, as torch does
            self._task_worker.pop(position, None)
            self._task_indices.pop(position, None)
        return None

    def _wait_s(self) -> float:
        if self._timeout > 0:
            return self._timeout
        if self._stall_warning_s is not None and not self._stall_warned:
            until_stall = self._last_reply_at + self._stall_warning_s - time.monotonic()
            return max(0.0, min(_LIVENESS_POLL_S, until_stall))
        return _LIVENESS_POLL_S

    def _check_stall(self) -> None:
        waited = time.monotonic() - self._last_reply_at
        limit = self._stall_warning_s
        if limit is not None and waited >= limit and not self._stall_warned:
            self._stall_warned = True
            warn_stall(self, waited)

    def _receive(self) -> None:
        """Block until some worker replies (or dies, or the timeout passes); file the replies."""
        self._collect_released()
        self._send_large_releases()  # before waiting: the worker may need the slab first
        poller, by_fd = self._group.poller()
        wait_s = self._wait_s()
        due = self._move_due()  # wake up to move a task queued behind a straggler
        until_due = wait_s if due is None else max(0.0, due - time.monotonic())
        move_wakeup = until_due < wait_s
        wait_s = min(wait_s, until_due)
        ready = poller.poll(max(0, int(wait_s * 1000 + 0.999)))
        got_reply = False
        for fd, _ in ready:
            w, is_conn = by_fd.get(fd, (None, False))  # gone if it was let go meanwhile
            if w is not None and is_conn:
                try:  # one message: the caller polls again for the rest
                    self._file(w, w.conn.recv())
                except (EOFError, OSError):
                    lost_worker(self, w)
                got_reply = True
        if got_reply or move_wakeup:
            self._move_queued_tasks()
        if not got_reply:
            check_workers_alive(self)
            if not ready and self._timeout > 0 and not move_wakeup:
                self._raise_timeout()
            self._check_stall()

    def _file(self, w: Any, reply: tuple) -> None:
        if not self._group.file_control(w, reply):
            self._file_reply(w, reply)

    def _file_reply(self, w: Any, reply: tuple) -> None:
        tag = reply[0]
        epoch, position = reply[1], reply[2]
        if tag == msg.DONE:
            self._group.reader.retire(w.worker_id, reply[6])
        if epoch != self._epoch:  # a reply to an abandoned epoch: recycle its slab
            if tag == msg.DONE:
                self._group.reader.release_now(w.worker_id, reply[3])
            return
        wid = w.worker_id
        now = time.monotonic()
        self._load[wid] -= 1
        queued = self._queued[wid]
        if queued and queued[0] == position:
            queued.popleft()
            self._stragglers.finished(wid, now)
        elif position in queued:
            queued.remove(position)
        self._last_reply_at = now
        self._stall_warned = False
        if position in self._moved and self._settle_moved(wid, reply):
            if self._sampler_done:
                self._let_idle_workers_go()
            return
        self._task_worker.pop(position, None)
        if tag == msg.EXHAUSTED:
            # Its iterable is spent: the tasks it still holds yield nothing either (torch
            # skips them too). Unless forgotten, in_order=False would wait for them forever.
            self._active[wid] = False
            for spent in (position, *queued):
                self._task_worker.pop(spent, None)
                self._task_indices.pop(spent, None)
            self._try_put_index()
            self._let_idle_workers_go()
            return
        if tag == msg.DONE:
            info = reply[8]
            self._gives_back[wid] = info[0] == 1 and info[8]
            if info[9]:
                self._warn_init_fn_seeds()
        if self._sampler_done:
            self._let_idle_workers_go()
        self._ready[position] = (wid, reply)
        if not self._in_order:
            self._arrivals.append(position)
        if tag == msg.DONE and not self._torch_depth:
            self._follow_concurrency(wid, info[0], reply[4])

    def _warn_init_fn_seeds(self) -> None:
        """NOTE [ Seeds set in worker_init_fn stay ] in ``workers.main_loop``; once per
        loader."""
        loader = self._loader_ref()
        if loader is None or loader._stoker_init_fn_seeds_told:
            return
        loader._stoker_init_fn_seeds_told = True
        warnings.warn(
            "worker_init_fn seeded the global RNGs (random, numpy or torch), so stoker leaves "
            "them to it: each worker draws from its own stream, as with torch, and the "
            "augmentations depend on num_workers. stoker's default seeding=\"per_batch\" "
            "already gives every batch its own seeded streams, the same for any num_workers; "
            "to have that, drop the seeding from worker_init_fn. To keep torch's behaviour "
            "without this warning, pass seeding=\"per_worker\".",
            stacklevel=2,
        )

    def _follow_concurrency(self, wid: int, concurrency: int, batch_bytes: int) -> None:
        """Raise a worker's task depth to keep its concurrent fetches busy, and for small
        batches (NOTE [ Deeper prefetch for small batches ])."""
        depth = max(self._prefetch, -(-concurrency // self._step_samples) + 1)
        if batch_bytes * _SMALL_BATCH_DEPTH <= _SMALL_BATCH_BUDGET:
            depth = max(depth, _SMALL_BATCH_DEPTH)
        if depth != self._depth[wid]:
            self._depth[wid] = depth
            self._fill()

    def _deliver(self, wid: int, reply: tuple) -> Any:
        position = reply[2]
        self._task_indices.pop(position, None)
        self._delivered(position)
        if reply[0] == msg.FAILED:
            raise rebuild(reply[3])
        _, _, _, segment_id, used, payload, _, skipped, info = reply
        self._stats.worker_batch(wid, info)
        if info[6] == "source" and not self._vector_trusted:
            self._vector_trusted = True
            loader = self._loader_ref()
            if loader is not None:
                loader._stoker_vector_trusted = self._dataset
        if skipped:
            self._skips.record(skipped)
        t0 = time.perf_counter()
        with stage_range(UNPACK):
            data = self._group.reader.unpack(wid, segment_id, used, payload)
        self._stats.unpacked(t0)
        if self._memory_watch is not None and time.monotonic() > self._watch_from:
            self._memory_watch.sample(self._worker_pids)
        if isinstance(data, EmptyBatch):
            return _EMPTY_STEP
        return self._pinned(data)

    # -- ending ------------------------------------------------------------------------------

    def _raise_timeout(self) -> None:
        # Like torch, the iterator stays usable: the caller may retry.
        where = describe_stall(self, with_stacks=True)
        err = LoaderTimeoutError(f"DataLoader timed out after {self._timeout} seconds")
        if where:
            add_note(err, f"stoker: {where}")
        raise err

    def _end_epoch(self) -> None:
        if not self._persistent:
            self._shutdown()

    def _shutdown(self) -> None:
        self._finalizer()

    def _shutdown_workers(self) -> None:  # torch's name, for code that calls it
        self._shutdown()

    @property
    def _workers(self) -> list[WorkerProcess]:
        """torch's name: the worker processes (code reads their pids or joins them)."""
        return [WorkerProcess(w) for w in self._group.workers]

    @property
    def stopped(self) -> bool:
        return self._group.stopped
