"""Sending the workers their tasks: the sampler's next indices to the worker whose turn it is,
a dataset told of each batch as it goes (NOTE [ The main process fetches for its workers ]),
tasks queued behind a straggler moved to an idle worker (NOTE [ Only stragglers move ] in
``stragglers.py``), workers with nothing left let go; a part of ``ProcessIterator``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stoker.engine.base_iter import BaseIterator
from stoker.engine.main_gathers import Gathered, MainGathers
from stoker.engine.stragglers import MovePolicy, StragglerWatch
from stoker.engine.task_book import TaskBook
from stoker.engine.worker_death import DeathWatch
from stoker.engine.worker_group import StallClock, WorkerGroup
from stoker.fastpaths.batched_columns import Decline
from stoker.sampling.fast_batches import draws_unseen_by_workers
from stoker.workers import protocol as msg


class Dispatch(BaseIterator):
    """``ProcessIterator``'s dispatch; the state it shares is set by ``ProcessIterator``."""

    _group: WorkerGroup
    _deaths: DeathWatch
    _stall: StallClock
    _persistent: bool
    _prefetch: int
    _in_order: bool
    _is_iterable: bool
    _may_move: bool
    _gives_back: list[bool]
    _step_samples: int
    _worker_pids: tuple[int, ...]
    _fetch_for_batch: Callable[[list[Any]], None] | None
    _fetch_for_stream: Callable[[int, int, int], None] | None
    _main_gathers: MainGathers | None

    def _file_reply(self, w: Any, message: msg.Reply | msg.Started) -> None:
        raise NotImplementedError  # ``ProcessIterator``'s: a reply read while dispatching

    def _prime(self, wid: int) -> None:
        """NOTE [ Tasks before the next fork ] in ``engine.worker_start``."""
        book = self._book
        if not self._is_iterable and book.load[wid] < min(1, book.depth[wid]) and not (
                book.sampler_done) and draws_unseen_by_workers(self._index_sampler) and (
                book.take_turn(wid)):
            self._try_put_index(wid)

    def _fill(self) -> None:
        """Send tasks until every worker holds its depth of them."""
        for _ in range(self._book.missing()):
            if self._book.sampler_done:
                return
            self._try_put_index()

    def _init_dispatch(self) -> None:
        self._asked = [0] * self._num_workers  # samples asked of each worker this epoch
        self._book = TaskBook(self._num_workers, self._prefetch, self._in_order,
                              self._gives_back)
        self._moves = MovePolicy(self._book, StragglerWatch(self._num_workers), self._may_move)
        self._stall.replied(time.monotonic())

    def _send(self, wid: int, message: msg.ToWorker) -> None:
        w = self._group.workers[wid]
        if isinstance(message, (msg.Task, msg.Reset)):
            self._group.feeders.fed(wid)  # NOTE [ torch's feeder threads in the main process ]
        try:
            msg.send(w.conn, message)
        except OSError:  # EPIPE/ECONNRESET: it died since the last poll; report the death
            self._deaths.lost(self._book, w, self._file_reply, waiting=False)

    def _let_idle_workers_go(self) -> None:
        """A non-persistent worker whose iterable ended exits now, as torch tells it to (its
        ``_mark_worker_as_unavailable``); the others live until the epoch ends, as torch's do
        (a program sees its workers in ``multiprocessing.active_children()`` until then)."""
        if self._persistent:
            return
        book = self._book
        for w in self._group.workers:
            if not w.stop_sent and not book.active[w.worker_id]:
                self._group.stop_early(w)

    def _try_put_index(self, wid: int | None = None) -> None:
        """Send the next task to worker ``wid``, or to the one the book picks."""
        if wid is None:
            wid = self._book.pick_worker()
        if wid is None:
            return
        try:
            position, index = self._cursor.next_index()
        except StopIteration:
            self._book.sampler_done = True
            self._let_idle_workers_go()
            return
        self._book.new_task(position, index)
        if self._main_gathers is None or not self._gathered_here(wid, position, index):
            self._send_task(wid, position, index)

    def _gathered_here(self, wid: int, position: int, index: Any) -> bool:
        """NOTE [ Gathers read the workers' starting copy ] in ``engine.main_gathers``: the
        batch from the main process's copy, filed as worker ``wid``'s; False if it declines
        (``wid`` loads it)."""
        assert self._main_gathers is not None
        if not self._in_order and self._book.queued[wid]:
            return False  # in_order=False yields a worker's batches in the order it loads them
        try:
            batch = self._main_gathers.batch(index)
        except Decline:
            return False
        # held against wid's depth until its turn to be handed out (``_next_data`` takes it
        # off first), as a task sent is until its reply arrives: the sampler is asked as
        # often, at the same points, as when the workers load these batches
        self._book.load[wid] += 1
        self._book.file(wid, position, Gathered(position, batch))
        # torch puts the task on wid's queue, which starts its feeder thread
        self._group.feeders.fed(wid)  # NOTE [ torch's feeder threads in the main process ]
        return True

    def _send_task(self, wid: int, position: int, index: Any) -> None:
        try:  # NOTE [ The main process fetches for its workers ] in storage.prefetch_threads
            if self._fetch_for_batch is not None:
                self._fetch_for_batch(list(index) if self._fetch_spec.auto_collation
                                      else [index])
            elif self._fetch_for_stream is not None:
                self._asked[wid] += self._step_samples
                self._fetch_for_stream(wid, self._num_workers, self._asked[wid])
        except Exception:  # the worker reads the batch as always, and reports there
            pass
        self._group.collect_released()
        release = self._group.take_release(wid)
        self._send(wid, msg.Task(self._cursor.epoch, position, index, release))
        if self._book.sent(wid, position) and self._may_move:  # timed only to move tasks
            self._moves.watch.started(wid, time.monotonic())

    # -- moving queued tasks to idle workers (NOTE [ Idle workers take queued tasks ]) --------

    def _idle_workers(self) -> list[int]:
        book = self._book
        return [
            w.worker_id for w in self._group.workers
            if not w.stop_sent and book.active[w.worker_id] and book.load[w.worker_id] == 0
        ]

    def _move_queued_tasks(self) -> None:
        """Give each idle worker a task queued behind a straggler at another worker."""
        due = self._moves.due(self._idle_workers())
        if due is None or due > time.monotonic():
            return
        self._read_waiting_replies()  # a task that looks queued may be answered already
        for thief in self._idle_workers():
            victim = self._moves.victim(self._worker_pids, time.monotonic())
            if victim is None:
                break
            position = self._book.take_queued(victim)
            self._send(victim, msg.Cancel(self._cursor.epoch, position))
            self._book.moved[position] = {victim, thief}
            self._send_task(thief, position, self._book.indices[position])
            self._stats.tasks_moved += 1
        self._let_idle_workers_go()

    def _read_waiting_replies(self) -> None:
        """File every reply already sent (a dead worker is reported by the next wait)."""
        for w in self._group.workers:
            if not w.stop_sent:
                for reply in self._group.drain(w):
                    self._file_reply(w, reply)
