"""Python stacks of a worker that crashed or is stuck, readable from the main process.

Each worker points ``faulthandler`` at an in-memory log (``segments.create_log``) and sends its
fd to the main process at start-up. ``DUMP_SIGNAL`` dumps every thread's stack there on request
without stopping the worker (that is how a stalled worker is shown). Where faulthandler was
already on (NOTE [ faulthandler as the parent left it ]), a fatal signal (SIGSEGV, SIGBUS,
SIGFPE, SIGABRT, SIGILL) dumps there too before the worker dies (then torch's own handler,
installed first as torch's worker installs it, runs as in torch's worker). Both work when the
worker is stuck in native code holding the GIL: the dump is done by faulthandler's C handler.

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


def install_in_worker() -> tuple[int | None, bool]:
    """Open this worker's stack log; returns its fd (to send) and whether a crash writes there.

    NOTE [ faulthandler as the parent left it ]
    torch's worker has faulthandler as its parent left it (fork) or as the interpreter's
    flags set it (spawn: ``-X faulthandler``, ``PYTHONFAULTHANDLER``), and
    ``faulthandler.is_enabled()`` there is a thing a dataset can read, as is the set of
    signals ``/proc/self/status`` lists as caught. So a worker turns faulthandler's crash
    dump on only where it is already on, and then only changes the file it writes to: the
    log, which the main process's error quotes. Where it is off, a crashed worker's error
    says how to get its Python stack instead. Stacks on request (``DUMP_SIGNAL``) are
    registered either way: ``faulthandler.register`` leaves ``is_enabled()`` alone.
    """
    fd = segments.create_log()
    if fd is None:
        return None, False  # pragma: no cover - non-Linux: stacks go to stderr as usual
    crash_stacks = faulthandler.is_enabled()
    if crash_stacks:
        # enable() would only change the file, and torch's handlers, set first, would run
        # alone on a crash. Disabling restores what faulthandler replaced in the parent, which
        # drops torch's handlers: set them again, so that faulthandler's dump chains to them.
        faulthandler.disable()
        _set_worker_signal_handlers()
        faulthandler.enable(file=fd, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
    return fd, crash_stacks


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
