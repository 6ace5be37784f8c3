"""Python stacks of a worker that crashed or is stuck, readable from the main process.

Each worker points ``faulthandler`` at an in-memory log (``segments.create_log``) and sends its
fd to the main process at start-up. A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT) dumps
every thread's stack there before the worker dies (then torch's own handler, installed first as
torch's worker installs it, runs as in torch's worker); ``DUMP_SIGNAL`` dumps them on request
without stopping it (that is how a stalled worker is shown). Both work when the worker is stuck
in native code holding the GIL: the dump is done by faulthandler's C signal handler.

NOTE [ The stack signal ]
The request is a real-time signal, ``SIGRTMAX - 2``, not ``SIGUSR1``: what a worker does on
SIGUSR1 is a program's (a job scheduler sends it before a time limit; Lightning handles it; by
default it ends the process), and torch's worker leaves it alone. No program or scheduler sends
that real-time signal to a data-loading worker; Python's signal table (``signal.getsignal``)
does not see faulthandler's handler, and an ``exec`` resets it, so children inherit nothing.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time

from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers

from stoker.transport import segments

DUMP_SIGNAL = signal.SIGRTMAX - 2  # NOTE [ The stack signal ]
_DUMP_WAIT_S = 1.0
_POLL_S = 0.02


def install_in_worker() -> int | None:
    """Route this worker's faulthandler output to a log; returns the log fd to send."""
    fd = segments.create_log()
    if fd is None:
        return None  # pragma: no cover - non-Linux: stacks go to stderr as usual
    if faulthandler.is_enabled():
        # Enabled in the parent (pytest does it): enable() would only change the file, and
        # torch's handlers, set first, would run alone on a crash. Disabling restores what
        # faulthandler replaced in the parent, which drops torch's handlers: set them again,
        # so that faulthandler's dump chains to them as in a fresh worker.
        faulthandler.disable()
        _set_worker_signal_handlers()
    faulthandler.enable(file=fd, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
    return fd


def request_stacks(pid: int, log_fd: int) -> str:
    """Ask a live worker for its stacks and return them (empty if it does not answer in 1 s)."""
    start = os.fstat(log_fd).st_size
    try:
        os.kill(pid, DUMP_SIGNAL)
    except ProcessLookupError:
        return ""
    deadline = time.monotonic() + _DUMP_WAIT_S
    last = start
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        size = os.fstat(log_fd).st_size
        if size > start and size == last:
            break  # written and no longer growing
        last = size
    return segments.read_log(log_fd, start) if last > start else ""
