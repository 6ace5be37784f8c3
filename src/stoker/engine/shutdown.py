"""Owning and releasing an iterator's workers and segments.

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

import select
from typing import Any

from stoker.transport import segments
from stoker.transport.slab_bank import SlabBank
from stoker.transport.slab_reader import SlabReader
from stoker.workers import protocol as msg
from stoker.workers.launch import WorkerHandle, stop_workers


class WorkerGroup:
    """The processes and segments of one iterator; ``stop()`` is idempotent."""

    def __init__(self) -> None:
        self.workers: list[WorkerHandle] = []
        self.reader = SlabReader()
        self.stack_logs: dict[int, int] = {}  # worker id -> fd of its faulthandler log
        self.stopped = False
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

    def stop_early(self, w: WorkerHandle) -> None:
        """Let one worker go before the others (it has nothing left to do this epoch); its
        socket and sentinel leave the poll set, so its exit wakes nobody."""
        w.ask_to_stop()
        if self._poller is not None:
            poller, by_fd = self._poller
            for fd in [fd for fd, (other, _) in by_fd.items() if other is w]:
                poller.unregister(fd)
                del by_fd[fd]

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            stop_workers(self.workers, drain=self.file_control)
        finally:
            self.reader.close(self.bank)
            for fd in self.stack_logs.values():
                segments.close(fd)
            self.stack_logs.clear()

    def file_control(self, w: WorkerHandle, message: msg.FromWorker) -> msg.Reply | None:
        """Handle a message that carries an fd (slab, stack log); a task's reply is returned."""
        if isinstance(message, msg.Slab):
            receive_slab(self.reader, w, message.ref)
        elif isinstance(message, msg.Hello):
            if message.has_log:
                fd = segments.recv_fd(w.conn)
                segments.open_received_log(fd)
                self.stack_logs[w.worker_id] = fd
        else:
            return message
        return None

    def drain(self, w: WorkerHandle) -> list[msg.Reply]:
        """Read what a (possibly dead) worker left in its socket; returns the replies."""
        replies = []
        try:
            while w.conn.poll():
                reply = self.file_control(w, msg.recv_from_worker(w.conn))
                if reply is not None:
                    replies.append(reply)
        except (EOFError, OSError):
            pass
        return replies


def receive_slab(reader: SlabReader, w: WorkerHandle, ref: Any) -> None:
    fd = segments.recv_fd(w.conn) if ref.name is None else None
    reader.adopt(w.worker_id, ref, fd)
