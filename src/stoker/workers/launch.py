"""Start and stop worker processes; each gets one duplex socket to the main process."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, cast

from stoker._core.process_exit import at_exit
from stoker._core.specs import WorkerSpec
from stoker.transport.reused_shm import MainSegments
from stoker.workers import protocol as msg
from stoker.workers.entry import parent_ends, worker_main, worker_main_once

_JOIN_TIMEOUT_S = 5.0


@dataclass
class WorkerHandle:
    worker_id: int
    process: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    stop_sent: bool = False  # asked to exit: its exit is expected, not a death
    # its batches' shared memory, kept to be written again (NOTE [ torch's shared memory,
    # reused ] in transport.reused_shm)
    reused: MainSegments = field(default_factory=MainSegments)
    # what the process object said when it was closed (it answers nothing after)
    closed: bool = False
    closed_exitcode: int | None = None
    closed_pid: int | None = None

    def ask_to_stop(self) -> None:
        if self.stop_sent:
            return
        self.stop_sent = True
        try:
            msg.send(self.conn, msg.Stop())
        except (OSError, ValueError):
            pass

    @property
    def pid(self) -> int | None:
        return self.closed_pid if self.closed else self.process.pid


class WorkerProcess:
    """A worker's process as torch's ``_workers`` lists it: ``pid``, ``exitcode``,
    ``is_alive()``, ``join()``, ``terminate()``, still answering once stoker has stopped the
    worker and closed its process object (code joins them after the loop, as torch's tests do)."""

    def __init__(self, handle: WorkerHandle) -> None:
        self._handle = handle
        self.pid = handle.pid

    def _process(self) -> Any:
        return None if self._handle.closed else self._handle.process

    @property
    def exitcode(self) -> int | None:
        process = self._process()
        return self._handle.closed_exitcode if process is None else process.exitcode

    def is_alive(self) -> bool:
        process = self._process()
        return process is not None and process.is_alive()

    def join(self, timeout: float | None = None) -> None:
        process = self._process()
        if process is not None:
            process.join(timeout)

    def terminate(self) -> None:
        process = self._process()
        if process is not None and process.exitcode is None:
            process.terminate()

    kill = terminate

    def __getattr__(self, name: str) -> Any:
        # the rest of multiprocessing.Process (name, daemon, ident, sentinel, close, ...) as the
        # process object answers it (once stoker closed it, as a closed one does: its name and
        # daemon flag, a ValueError for the rest)
        if name.startswith("__") or name == "_handle":
            raise AttributeError(name)
        return getattr(self._handle.process, name)


@contextlib.contextmanager
def gc_frozen_for_fork(start_method: str | None, asked: bool) -> Iterator[None]:
    """Move the parent's objects out of the collector's reach while workers are forked
    (beyond torch: ``gc_freeze``, NOTE [ Same as torch unless asked ]).

    A full collection in a forked worker touches every tracked object of the parent and so
    copies their pages into the worker (measured: 39 MiB for a parent with 500k dicts, 0.9
    MiB with this). What a program can tell: in the workers, objects made before ``iter()``
    are never collected (cyclic garbage among them keeps its finalizers) and
    ``gc.get_objects()`` leaves them out; in the main process they all move to the oldest
    generation. A program that froze its objects itself is left as it is.
    """
    if start_method != "fork" or not asked or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def default_context() -> BaseContext:
    """torch's default: the ``multiprocessing`` module itself, whose ``Process`` is the generic
    one (workers named ``Process-N``, not ``ForkProcess-N``) and whose start method is the
    process-wide one (``fork`` on Linux before Python 3.14, or what the program set with
    ``multiprocessing.set_start_method``): NOTE [ The worker's process is torch's ]."""
    return cast(BaseContext, multiprocessing)


@dataclass
class NewWorker:
    """A worker's process object and socket ends, made but not started (``make_worker``)."""

    worker_id: int
    process: Any
    parent_end: Connection
    child_end: Connection


def make_worker(ctx: BaseContext, spec: WorkerSpec, once: Any = None) -> NewWorker:
    """A worker's process, not yet started; ``once`` (a ``spec_once.PickledSpec``) carries the
    spec instead of pickling it for this worker alone. Made in worker-id order, in the thread
    that iterates, so the processes are named and numbered as torch's (``Process-N``: NOTE
    [ The worker's process is torch's ])."""
    parent_end, child_end = ctx.Pipe(duplex=True)
    target, args = (
        (worker_main, (spec, child_end))
        if once is None
        else (worker_main_once, (once.handle(), spec.worker_id, child_end))
    )
    process = ctx.Process(target=target, args=args)  # type: ignore[attr-defined]
    process.daemon = True
    return NewWorker(spec.worker_id, process, parent_end, child_end)


def launch(new: NewWorker) -> WorkerHandle:
    """Start a worker ``make_worker`` made."""
    parent_ends.add(new.parent_end)  # a forked worker closes its copies
    try:
        new.process.start()
    except BaseException:
        new.parent_end.close()
        new.child_end.close()
        raise
    new.child_end.close()
    return WorkerHandle(new.worker_id, new.process, new.parent_end)


def start_worker(ctx: BaseContext, spec: WorkerSpec, once: Any = None) -> WorkerHandle:
    """Make and start one worker."""
    return launch(make_worker(ctx, spec, once))


# NOTE [ Workers at interpreter exit ]
# torch's iterator does nothing once the interpreter has begun to exit (``python_exit_status``):
# its workers, daemonic, are ended by multiprocessing's exit hook with SIGTERM, and torch's
# handler in the worker (``_set_worker_signal_handlers``) calls ``_exit(0)`` on a SIGTERM from
# its parent. So a worker of a loader still alive at exit (persistent workers held by a global,
# an iterator kept) runs no more Python: what its dataset printed into a block-buffered stdout
# (a log file, a pipe) is never written, and no finalizer of the worker runs. Asked to STOP
# instead, stoker's worker would return normally and flush that output after the program's
# last line. At exit (``atexit`` hooks running: a loop still going in a non-daemon thread
# after the main thread ended is not there yet), stoker's workers are therefore ended as
# torch's are: SIGTERM from the main process, where the same handler runs.


def stop_workers(workers: list[WorkerHandle], drain: Any = None) -> None:
    """Ask every worker to stop, wait briefly, then terminate and kill what is left; at
    interpreter exit, terminate them at once (NOTE [ Workers at interpreter exit ]).

    ``drain(handle, message)`` receives anything a worker sends while we wait, so that a worker
    blocked writing a reply is never waited on forever.
    """
    if at_exit():
        for w in workers:
            w.stop_sent = True  # an expected exit, not a death
            if w.process.exitcode is None:
                w.process.terminate()
    for w in workers:
        w.ask_to_stop()
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    alive = [w for w in workers if w.process.exitcode is None]
    while alive and time.monotonic() < deadline:
        by_sentinel = {w.process.sentinel: w for w in alive}
        by_conn = {w.conn: w for w in alive if not w.conn.closed}
        ready = multiprocessing.connection.wait(
            [*by_sentinel, *by_conn], timeout=max(0.0, deadline - time.monotonic())
        )
        for r in ready:
            if r in by_conn:
                _drain_one(by_conn[r], drain)
        alive = [w for w in alive if w.process.exitcode is None]
    for w in alive:
        w.process.terminate()
    for w in alive:
        w.process.join(1.0)
        if w.process.exitcode is None:
            w.process.kill()
    for w in workers:
        w.process.join()
        w.conn.close()
        w.closed_exitcode, w.closed_pid = w.process.exitcode, w.process.pid
        w.closed = True
        w.process.close()


def _drain_one(w: WorkerHandle, drain: Any) -> None:
    try:
        message = msg.recv_from_worker(w.conn, segments=w.reused)
    except (EOFError, OSError):
        w.conn.close()
        return
    if drain is not None:
        drain(w, message)
