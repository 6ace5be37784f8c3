"""The workers' Python stacks, sampled while the doctor measures a loader (Linux).

NOTE [ Sampling the workers' stacks ]
    A stoker worker routes its stack dumps to an in-memory log (``workers/diagnostics.py``: how
    a stuck worker is shown); the workers started while ``WorkerStacks`` is open also register
    ``DUMP_SIGNAL`` (a real-time signal, NOTE [ The stack signal ]; outside the doctor, workers
    catch no signal torch's do not). The doctor samples from outside
    the loader, through the operating system only: every ``interval_s`` it lists this process's
    children, keeps those whose ``/proc/<pid>/status`` says that signal is caught and that hold
    the log (a ``/memfd:stoker-worker-stacks`` fd, opened here through ``/proc/<pid>/fd``),
    signals them and reads what each appended. A process that does not catch it is never
    signalled (its default action would kill it).

    The dump is written by faulthandler's C handler wherever the worker is, holding the GIL or
    not, so a sample is not biased towards code that releases the GIL (a sampler thread inside
    the worker would be). It shows Python frames only: a C call (Pillow's decoder, OpenCV) is
    seen as the Python line that made it (``decode_verdict.py`` reads that line). The dumps
    append to the worker's log; a crash report reads the log's newest bytes, so a worker that
    dies later still shows its own last stacks. Where the
    children cannot be read (another OS, ptrace restrictions) nothing is sampled and the
    doctor says nothing about the stacks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO

from stoker.workers.diagnostics import DUMP_SIGNAL, stacks_by_signal

_LOG_NAME = "/memfd:stoker-worker-stacks"
_SIGNAL = DUMP_SIGNAL
_WAIT_S = 0.25  # a dump not written by then is dropped
_POLL_S = 0.002


class WorkerStacks:
    """Samples the stacks of this process's stoker workers on a daemon thread, as a context
    manager; ``samples`` holds one faulthandler dump per worker per round."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.samples: list[str] = []
        self._logs: dict[int, IO[bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stoker-doctor-stacks",
                                        daemon=True)
        self._by_signal = stacks_by_signal()

    def __enter__(self) -> WorkerStacks:
        self._by_signal.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._by_signal.__exit__(None, None, None)
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples += self._round()
            except OSError:
                continue  # a worker ended while being read: the next round lists again

    def _round(self) -> list[str]:
        pids = _children(os.getpid())
        for pid in [p for p in self._logs if p not in pids]:
            self._logs.pop(pid).close()
        asked: dict[int, int] = {}
        for pid in pids:
            log = self._logs.get(pid) or _open_log(pid)
            if log is None:
                continue
            self._logs[pid] = log
            asked[pid] = os.fstat(log.fileno()).st_size
            try:
                os.kill(pid, _SIGNAL)
            except ProcessLookupError:
                del asked[pid]
        return [text for pid, start in asked.items() if (text := _read_new(self._logs[pid],
                                                                           start))]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                found.update(int(x) for x in f.read().split())
        except OSError:
            continue
    return found


def _catches_dump_signal(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(_SIGNAL) - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _open_log(pid: int) -> IO[bytes] | None:
    """The worker's stack log, opened here; None for a process that is not a stoker worker
    (or cannot be read)."""
    if not _catches_dump_signal(pid):
        return None
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(_LOG_NAME):
                return open(f"/proc/{pid}/fd/{fd}", "rb")  # noqa: SIM115 - kept across rounds
    except OSError:
        return None
    return None


def _read_new(log: IO[bytes], start: int) -> str:
    """What the worker appended after ``start``, once it stopped growing."""
    deadline = time.monotonic() + _WAIT_S
    last = start
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        size = os.fstat(log.fileno()).st_size
        if size > start and size == last:
            return os.pread(log.fileno(), size - start, start).decode("utf-8", "replace")
        last = size
    return ""
