"""An iterator's workers: their sockets and liveness, slabs released back to them, shutdown;
the stall clock that says which worker is stuck on what, with its stack (``StallClock``); the
RNG states riding on their replies, resolved in the order the replies are read (``StreamLog``,
NOTE [ Worker streams resume ] in ``engine.worker_streams``).

NOTE [ Loader shutdown ]
Everything an iterator starts (worker processes, their sockets, the slab fds) belongs to one
``WorkerGroup``. The iterator never holds the loader, and the group never holds the iterator,
so a ``weakref.finalize`` on the iterator can stop the group when the iterator is collected.
The group is stopped, exactly once, by whichever comes first:

* the end of an epoch (non-persistent workers), an error the iterator raises for a dead
  worker, or ``DataLoader.__del__``/collection of the iterator (``break``, exceptions, ``del``);
* interpreter exit (the finalizer's atexit hook), e.g. after an uncaught KeyboardInterrupt.

Non-persistent workers with nothing left to do in the epoch (the sampler is spent and their
tasks are answered, or their iterable ended) are sent STOP at once, so they exit while the
last batches are consumed; their exit is expected and is not reported as a death.

Stopping sends STOP, waits up to 5 s for exits while draining replies (a worker blocked on a
full socket must not deadlock the wait), then terminates and kills the rest, joins every
process and closes every fd. Workers ignore SIGINT (Ctrl-C reaches the whole process group;
the main process decides) and leave on their own when the main process dies: end-of-file on
their socket, or a watchdog thread that sees the parent pid change even while user code is
stuck. Segments are memfds, freed by the kernel when the last holder goes, so no path leaves
anything in /dev/shm. Batches the user still holds stay valid: their mappings outlive the fds.
"""

from __future__ import annotations

import logging
import os
import select
import time
from typing import TYPE_CHECKING, Any, NoReturn

from stoker._core.notes import add_note
from stoker.errors import LoaderTimeoutError, StallWarning
from stoker.transport import segments
from stoker.transport.slab_bank import SlabBank
from stoker.transport.slab_reader import SlabReader
from stoker.workers import protocol as msg
from stoker.workers.diagnostics import request_stacks
from stoker.workers.feeder_stand_in import MainFeeders
from stoker.workers.launch import WorkerHandle, stop_workers
from stoker.workers.remote_errors import describe_indices

if TYPE_CHECKING:
    from stoker.engine.task_book import TaskBook
    from stoker.engine.worker_streams import WorkerStreams

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


class WorkerGroup:
    """The processes and segments of one iterator; ``stop()`` is idempotent."""

    def __init__(self, num_workers: int) -> None:
        self.workers: list[WorkerHandle] = []
        self.reader = SlabReader()
        # Slab ids each worker's batches released, waiting to ride back with its next message.
        self._to_release: list[list[int]] = [[] for _ in range(num_workers)]
        self.stack_logs: dict[int, int] = {}  # worker id -> fd of its faulthandler log
        self.stack_asks: dict[int, int] = {}  # worker id -> fd its stacks are asked through
        self.feeders = MainFeeders()  # NOTE [ torch's feeder threads in the main process ]
        self.crash_stacks: set[int] = set()  # worker ids whose crash writes to that log
        self.stopped = False
        self._made_in = os.getpid()  # NOTE [ A forked child leaves its parent's things alone ]
        self._getpid = os.getpid  # still there when module globals are gone at interpreter exit
        self._stopped_as_copy = False
        self._poller: tuple[select.poll, dict[int, tuple[WorkerHandle, bool]]] | None = None
        # Where idle slabs go when the workers stop (fork only): NOTE [ Slabs outlive workers ]
        self.bank: SlabBank | None = None

    def poller(self) -> tuple[select.poll, dict[int, tuple[WorkerHandle, bool]]]:
        """One poll object over every worker's socket and exit sentinel, built once (the
        workers do not change): fd -> (worker, is its socket)."""
        if self._poller is None:
            poller, by_fd = select.poll(), {}
            for w in self.workers:
                if w.stop_sent:
                    continue
                for fd, is_conn in ((w.conn.fileno(), True), (w.process.sentinel, False)):
                    poller.register(fd, select.POLLIN)
                    by_fd[fd] = (w, is_conn)
            self._poller = (poller, by_fd)
        return self._poller

    @property
    def pids(self) -> tuple[int | None, ...]:
        return tuple(w.pid for w in self.workers)

    # -- slabs going back (NOTE [ Slabs come back before the next task ]) ----------------------

    def collect_released(self) -> None:
        """Sort the slabs the user let go of since the last call by worker."""
        reader = self.reader
        if not reader.released and reader.pins is None:
            return  # nothing let go (always, without slab_transport)
        for wid, ids in reader.take_released().items():
            if wid < len(self.workers):
                self._to_release[wid].extend(ids)

    def take_release(self, wid: int, settle: bool = True) -> list[int]:
        """Worker ``wid``'s released slab ids (or reused segments' ids: NOTE [ torch's shared
        memory, reused ]; ``settle=False``: the caller settles them), to send with its next
        message."""
        ids, self._to_release[wid] = self._to_release[wid], []
        if settle and wid < len(self.workers):
            ids += self.workers[wid].reused.settle()
        return ids

    def large_releases(self) -> list[int]:
        """Workers to whom released slabs should go back at once, on their own."""
        return [
            w.worker_id for w in self.workers
            if (ids := self._to_release[w.worker_id]) and not w.stop_sent and any(
                self.reader.nbytes(w.worker_id, sid) >= _EAGER_RELEASE_BYTES for sid in ids)
        ]

    # -- stopping ----------------------------------------------------------------------------

    def stop_early(self, w: WorkerHandle) -> None:
        """Let one worker go before the others (it has nothing left to do this epoch); its
        socket and sentinel leave the poll set, so its exit wakes nobody."""
        w.ask_to_stop()
        if self._poller is not None:
            poller, by_fd = self._poller
            for fd in [fd for fd, (other, _) in by_fd.items() if other is w]:
                poller.unregister(fd)
                del by_fd[fd]

    @property
    def copied_by_fork(self) -> bool:
        """This is a forked child's copy (NOTE [ A forked child leaves its parent's things
        alone ])."""
        return self._getpid() != self._made_in

    @property
    def running_when_copied(self) -> bool:
        """A forked child's copy of a group whose workers ran in the parent at the fork (the
        copy's own ``stop``, its finalizer's, may have run since: a collection runs weakref
        callbacks before ``__del__``)."""
        return self.copied_by_fork and (not self.stopped or self._stopped_as_copy)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.copied_by_fork:  # the parent stops its own workers
            self._stopped_as_copy = True
            return
        try:
            stop_workers(self.workers, drain=self.file_control)
        finally:
            self.feeders.stop()
            self.reader.close(self.bank)
            for fd in [*self.stack_logs.values(), *self.stack_asks.values()]:
                segments.close(fd)
            self.stack_logs.clear()
            self.stack_asks.clear()

    def file_control(self, w: WorkerHandle, message: msg.FromWorker
                     ) -> msg.Reply | msg.Started | None:
        """Handle a message that carries an fd (slab, stack log); a task's reply is returned."""
        if isinstance(message, msg.Slab):
            receive_slab(self.reader, w, message.ref)
        elif isinstance(message, msg.Hello):
            if message.has_log:
                fd, ask = msg.recv_fds(w.conn, 2)
                os.set_blocking(ask, False)  # a stuck worker's full pipe never blocks us
                segments.open_received_log(fd)
                segments.open_received_log(ask)
                self.stack_logs[w.worker_id] = fd
                self.stack_asks[w.worker_id] = ask
                if message.crash_stacks:
                    self.crash_stacks.add(w.worker_id)
        else:
            return message
        return None

    def drain(self, w: WorkerHandle) -> list[msg.Reply | msg.Started]:
        """Read what a (possibly dead) worker left in its socket; returns the replies."""
        replies = []
        try:
            while w.conn.poll():
                reply = self.file_control(w, msg.recv_from_worker(w.conn, segments=w.reused))
                if reply is not None:
                    replies.append(reply)
        except (EOFError, OSError):
            pass
        return replies


def receive_slab(reader: SlabReader, w: WorkerHandle, ref: Any) -> None:
    fd = msg.recv_fd(w.conn) if ref.name is None else None
    reader.adopt(w.worker_id, ref, fd)


# -- stalls: no reply for a while -----------------------------------------------------------


def describe_stall(group: WorkerGroup, book: TaskBook, with_stacks: bool) -> str:
    """One paragraph per busy worker: id, pid, held samples and (optionally) its stack."""
    parts = []
    for wid, indices in book.held_by_worker().items():
        w = group.workers[wid]
        flat = [j for i in indices for j in (i if isinstance(i, list) else [i])]
        part = f"worker {wid} (pid {w.pid}) holds {describe_indices(flat)}"
        log_fd, ask_fd = group.stack_logs.get(wid), group.stack_asks.get(wid)
        if with_stacks and log_fd is not None and ask_fd is not None:
            stacks = request_stacks(ask_fd, log_fd).strip()
            # NOTE [ Stacks on request ] in workers/diagnostics.py
            part += (f"; its stack now:\n{stacks}\n" if stacks else
                     "; its stack did not come within 1 s (native code holding the GIL?)")
        parts.append(part)
    return "; ".join(parts)


def warn_stall(group: WorkerGroup, book: TaskBook, waited_s: float) -> None:
    """The stall report: a WARNING on the ``stoker.engine.worker_group`` logger, not through
    ``warnings``: the loader keeps waiting and the run may well succeed, where torch says
    nothing (NOTE [ torch's voice ] in ``_core/torch_voice.py``). The record's ``category``
    is ``stoker.StallWarning``."""
    detail = describe_stall(group, book, with_stacks=True)
    logging.getLogger(__name__).warning(
        "stoker: no batch for %.0f s; %s. The loader keeps waiting. If this is expected (very "
        "slow samples), raise stall_warning_s or pass stall_warning_s=None; to fail instead of "
        "waiting, set timeout=<seconds>.", waited_s, detail, extra={"category": StallWarning},
    )


class StallClock:
    """Since when no reply came; how long to wait for one; the stall warning (once per stall)
    and the ``timeout`` error, both naming what each busy worker holds."""

    def __init__(self, timeout_s: float, stall_warning_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.stall_warning_s = stall_warning_s
        self._last_reply_at = time.monotonic()
        self._warned = False

    def replied(self, now: float) -> None:
        self._last_reply_at = now
        self._warned = False

    def wait_s(self, poll_s: float) -> float:
        """How long the next wait for a reply may block: ``timeout``, or until the stall
        warning is due, at most ``poll_s`` (a liveness check follows every wait)."""
        if self.timeout_s > 0:
            return self.timeout_s
        if self.stall_warning_s is not None and not self._warned:
            until_stall = self._last_reply_at + self.stall_warning_s - time.monotonic()
            return max(0.0, min(poll_s, until_stall))
        return poll_s

    def check(self, group: WorkerGroup, book: TaskBook) -> None:
        waited = time.monotonic() - self._last_reply_at
        limit = self.stall_warning_s
        if limit is not None and waited >= limit and not self._warned:
            self._warned = True
            warn_stall(group, book, waited)

    def timed_out(self, group: WorkerGroup, book: TaskBook) -> NoReturn:
        # Like torch, the iterator stays usable: the caller may retry.
        where = describe_stall(group, book, with_stacks=True)
        err = LoaderTimeoutError(f"DataLoader timed out after {self.timeout_s} seconds")
        if where:
            add_note(err, f"stoker: {where}")
        try:
            raise err
        finally:  # no cycle through this frame: the iterator goes with the traceback, as torch's
            del err


class StreamLog:
    """The iterator's side of the replies: a worker's None (states unchanged since its last
    reply) resolved in the order its replies are read, ``Started``/``Exhausted`` filed."""

    def __init__(self, num_workers: int, kind: str) -> None:
        self._latest: list[Any] = [None] * num_workers
        self._map_style = kind == "map"

    def _resolve(self, wid: int, rngs: Any) -> Any:
        if rngs is None:
            return self._latest[wid]
        self._latest[wid] = rngs
        return rngs

    def file(self, wid: int, reply: msg.Reply | msg.Started, epoch: int,
             streams: WorkerStreams) -> msg.Reply | None:
        """The reply with its states resolved; None for a ``Started`` (filed here)."""
        if isinstance(reply, msg.Started):
            rngs = self._resolve(wid, reply.rngs)
            if reply.epoch == epoch:
                streams.started(wid, rngs, reply.dataset_state)
            return None
        if isinstance(reply, msg.Exhausted):
            rngs = self._resolve(wid, reply.rngs)
            if reply.epoch == epoch:
                streams.ended(wid, rngs, reply.dataset_state)
        elif self._map_style and isinstance(reply, (msg.Done, msg.Failed)):
            if reply.rngs is not None:
                self._latest[wid] = reply.rngs
            elif self._latest[wid] is not None:
                return reply._replace(rngs=self._latest[wid])
        return reply
