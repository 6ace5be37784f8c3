"""Say which worker is stuck on which samples, with its current Python stack."""

from __future__ import annotations

import time
import warnings
from typing import NoReturn

from stoker.engine.task_book import TaskBook
from stoker.engine.worker_group import WorkerGroup
from stoker.errors import LoaderTimeoutError, StallWarning
from stoker.workers.diagnostics import request_stacks
from stoker.workers.remote_errors import add_note, describe_indices


def describe_stall(group: WorkerGroup, book: TaskBook, with_stacks: bool) -> str:
    """One paragraph per busy worker: id, pid, held samples and (optionally) its stack."""
    parts = []
    for wid, indices in book.held_by_worker().items():
        w = group.workers[wid]
        flat = [j for i in indices for j in (i if isinstance(i, list) else [i])]
        part = f"worker {wid} (pid {w.pid}) holds {describe_indices(flat)}"
        log_fd = group.stack_logs.get(wid)
        if with_stacks and log_fd is not None and w.pid is not None:
            stacks = request_stacks(w.pid, log_fd).strip()
            if stacks:
                part += f"; its stack now:\n{stacks}\n"
        parts.append(part)
    return "; ".join(parts)


def warn_stall(group: WorkerGroup, book: TaskBook, waited_s: float) -> None:
    detail = describe_stall(group, book, with_stacks=True)
    warnings.warn(
        f"stoker: no batch for {waited_s:.0f} s; {detail}. The loader keeps waiting. If this is "
        "expected (very slow samples), raise stall_warning_s or pass stall_warning_s=None; to "
        "fail instead of waiting, set timeout=<seconds>.",
        StallWarning,
        stacklevel=5,
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
        raise err
