"""Start and stop worker processes; each gets one duplex socket to the main process."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.workers import protocol as msg
from stoker.workers.entry import parent_ends, worker_main, worker_main_once

_JOIN_TIMEOUT_S = 5.0


@dataclass
class WorkerHandle:
    worker_id: int
    process: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    stop_sent: bool = False  # asked to exit: its exit is expected, not a death
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


@contextlib.contextmanager
def gc_frozen_for_fork(start_method: str | None) -> Iterator[None]:
    """Move the parent's objects out of the collector's reach while workers are forked.

    A full collection in a forked worker touches every tracked object of the parent and so
    copies their pages into the worker (measured: 39 MiB for a parent with 500k dicts, 0.9
    MiB with this). ``gc.freeze`` has no effect on the parent's own collections after
    ``gc.unfreeze``.
    """
    if start_method != "fork":
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def default_context() -> BaseContext:
    """``fork`` where it exists (instant start, datasets need not pickle); else the default."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def start_worker(ctx: BaseContext, spec: WorkerSpec, once: Any = None) -> WorkerHandle:
    """Start one worker; ``once`` (a ``spec_once.PickledSpec``) carries the spec instead of
    pickling it for this worker alone."""
    parent_end, child_end = ctx.Pipe(duplex=True)
    target, args = (
        (worker_main, (spec, child_end))
        if once is None
        else (worker_main_once, (once.handle(), spec.worker_id, child_end))
    )
    process = ctx.Process(  # type: ignore[attr-defined]
        target=target, args=args, daemon=True, name=f"stoker-worker-{spec.worker_id}"
    )
    parent_ends.add(parent_end)  # a forked worker closes its copies
    try:
        process.start()
    except BaseException:
        parent_end.close()
        child_end.close()
        raise
    child_end.close()
    return WorkerHandle(spec.worker_id, process, parent_end)


def stop_workers(workers: list[WorkerHandle], drain: Any = None) -> None:
    """Ask every worker to stop, wait briefly, then terminate and kill what is left.

    ``drain(handle, message)`` receives anything a worker sends while we wait, so that a worker
    blocked writing a reply is never waited on forever.
    """
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
        message = msg.recv_from_worker(w.conn)
    except (EOFError, OSError):
        w.conn.close()
        return
    if drain is not None:
        drain(w, message)
