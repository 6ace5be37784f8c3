"""Say which worker is stuck on which samples, with its current Python stack."""

from __future__ import annotations

import warnings
from typing import Any

from stoker.workers.diagnostics import request_stacks
from stoker.workers.remote_errors import describe_indices


class StallWarning(UserWarning):
    """No batch arrived for longer than ``stall_warning_s``; the loader keeps waiting."""


def held_by_worker(it: Any) -> dict[int, list[Any]]:
    held: dict[int, list[Any]] = {}
    for position, index in sorted(it._task_indices.items()):
        wid = it._task_worker.get(position)
        if wid is not None:
            held.setdefault(wid, []).append(index)
    return held


def describe_stall(it: Any, with_stacks: bool) -> str:
    """One paragraph per busy worker: id, pid, held samples and (optionally) its stack."""
    parts = []
    for wid, indices in held_by_worker(it).items():
        w = it._group.workers[wid]
        flat = [j for i in indices for j in (i if isinstance(i, list) else [i])]
        part = f"worker {wid} (pid {w.pid}) holds {describe_indices(flat)}"
        log_fd = it._group.stack_logs.get(wid)
        if with_stacks and log_fd is not None:
            stacks = request_stacks(w.pid, log_fd).strip()
            if stacks:
                part += f"; its stack now:\n{stacks}\n"
        parts.append(part)
    return "; ".join(parts)


def warn_stall(it: Any, waited_s: float) -> None:
    detail = describe_stall(it, with_stacks=True)
    warnings.warn(
        f"stoker: no batch for {waited_s:.0f} s; {detail}. The loader keeps waiting. If this is "
        "expected (very slow samples), raise stall_warning_s or pass stall_warning_s=None; to "
        "fail instead of waiting, set timeout=<seconds>.",
        StallWarning,
        stacklevel=5,
    )
