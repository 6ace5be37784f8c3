"""The threads torch's queues start, stood in for where stoker's sockets need none.

NOTE [ torch's feeder thread in a worker ]
torch's worker sends each result through a ``multiprocessing.Queue``, whose first ``put``
starts a daemon thread named ``QueueFeederThread``; from then on a dataset's own code counts it
(``threading.enumerate()``, ``threading.active_count()``, and Python 3.12's warning that
``os.fork`` in a process with threads may deadlock). A stoker worker sends from the thread that
made the result, so it starts a thread of that name at the same point instead: after its first
reply to a task (a batch, an error, the end of an iterable) or to a new epoch's reset, where
torch's worker puts. The thread waits on a lock: it runs no code but the step of the next
NOTE, holds nothing, and goes with the process.

NOTE [ torch's resource sharer in a worker ]
torch's worker pickles a batch whose storages go by fd with ``multiprocessing``'s ``DupFd``,
which registers the fd with the process's resource sharer: its first registration starts a
daemon thread, ``Thread-N (_serve)`` (the main process connects to it to fetch the fd), that
lives as long as the worker and takes a number from the ``Thread-N`` names a dataset's own
threads get. stoker sends those fds over its socket (NOTE [ Batches cross as torch's do ]), so
after its first batch sent with fds its feeder stand-in, woken as torch's feeder is by that
put, starts a parked thread named as torch's once it has the GIL (torch's feeder needs the GIL
to pickle the batch): while the worker's own thread runs Python, that is at its next blocking
call or after the interpreter's switch interval, under both loaders; when it appears is a race
between the two threads under both.

NOTE [ torch's feeder threads in the main process ]
torch's iterator gives each worker an index queue, a ``multiprocessing.Queue`` too: its first
``put`` (the worker's first task, after every worker has started, or a persistent worker's
reset) starts a ``QueueFeederThread`` in the main process, which ends once the iterator
shuts its workers down and closes the queue. A program's training loop counts them. stoker
sends tasks over its sockets from the iterating thread, so ``MainFeeders`` starts a parked
thread of that name per worker at those points (never while workers are still being forked:
Python 3.12 warns about a fork in a process with threads, and torch forks before it puts) and
lets them end when the workers stop.
"""

from __future__ import annotations

import threading

_fds_sent: threading.Lock | None = None  # the feeder stand-in waits on it
_sharing = False  # a reply with fds has been sent


def after_put(shared_fds: bool = False) -> None:
    """Called after each reply torch's worker would have ``put``; starts the thread once.
    ``shared_fds``: the reply carried storages by fd, which torch's feeder thread hands to
    ``multiprocessing``'s resource sharer (NOTE [ torch's resource sharer in a worker ])."""
    global _fds_sent, _sharing
    if _fds_sent is None:
        _fds_sent = _never()
        threading.Thread(target=_queue_feeder_stand_in, args=(_fds_sent,),
                         name="QueueFeederThread", daemon=True).start()
    if shared_fds and not _sharing:
        _sharing = True
        _fds_sent.release()


def _never() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def _queue_feeder_stand_in(fds_sent: threading.Lock) -> None:
    # Woken as torch's feeder is by a put, it needs the GIL to go on, as that one needs it to
    # pickle the batch: the resource sharer's thread starts when torch's would.
    fds_sent.acquire()
    # unnamed, so it takes a Thread-N number as torch's does: "Thread-N (_serve)"
    threading.Thread(target=_serve, args=(_never(),), daemon=True).start()
    _never().acquire()


def _serve(never: threading.Lock) -> None:
    never.acquire()


class MainFeeders:
    """The main process's side (NOTE [ torch's feeder threads in the main process ]): one
    parked ``QueueFeederThread`` per worker that has been sent a task or a reset, none before
    every worker has started; released when the workers stop."""

    def __init__(self) -> None:
        self._locks: dict[int, threading.Lock] = {}
        self._waiting: list[int] = []  # fed before every worker had started
        self._ready = False

    def fed(self, worker_id: int) -> None:
        """A task or reset went to ``worker_id``: where torch's iterator puts to its queue."""
        if worker_id in self._locks or worker_id in self._waiting:
            return
        if not self._ready:
            self._waiting.append(worker_id)
            return
        never = self._locks[worker_id] = _never()
        threading.Thread(target=_parked, args=(never,), name="QueueFeederThread",
                         daemon=True).start()

    def all_started(self) -> None:
        """Every worker runs (or the start failed): torch's first puts come now."""
        self._ready = True
        waiting, self._waiting = self._waiting, []
        for worker_id in waiting:
            self.fed(worker_id)

    def stop(self) -> None:
        """The threads end on their own, as torch's end once their queue is closed."""
        for never in self._locks.values():
            never.release()
        self._locks.clear()
        self._waiting.clear()


def _parked(never: threading.Lock) -> None:
    never.acquire()
