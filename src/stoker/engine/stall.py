"""Say which worker is stuck on which samples, with its current Python stack."""

from __future__ import annotations

import warnings

from stoker.engine.task_book import TaskBook
from stoker.engine.worker_group import WorkerGroup
from stoker.errors import StallWarning
from stoker.workers.diagnostics import request_stacks
from stoker.workers.remote_errors import describe_indices


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
