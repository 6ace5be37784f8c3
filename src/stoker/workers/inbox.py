"""A worker's incoming messages: read from its socket directly, or by a reader thread once
fetch threads exist, and read ahead to find tasks the main process took back."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from stoker.workers import protocol as msg

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

    def __init__(self, conn: Connection, free: Callable[[list[int]], None]) -> None:
        self.conn = conn
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # also fed by fetch threads
        self._free = free  # slab ids the main process gave back
        self._read_ahead: deque[tuple[str, Any]] = deque()
        self._reader_started = False

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
            reader = threading.Thread(
                target=_read_socket, args=(self.conn, self.events), daemon=True
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
        while self.conn.poll():
            event = self._recv()
            item = event[1]
            if event[0] == MESSAGE and isinstance(item, (msg.Release, msg.Task)):
                # Slabs given back are free now, also those riding with a task read ahead.
                self._free(item.released)
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
                return
