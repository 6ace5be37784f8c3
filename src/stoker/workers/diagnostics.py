"""Python stacks of a worker that crashed or is stuck, readable from the main process.

Each worker points its stack dumps at an in-memory log (``segments.create_log``) and sends the
log's fd to the main process at start-up, with the write end of a pipe the main process asks
for stacks through (NOTE [ Stacks on request ]). Where faulthandler was already on (NOTE
[ faulthandler as the parent left it ]), a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT,
SIGILL) dumps there too before the worker dies (then torch's own handler, installed first as
torch's worker installs it, runs as in torch's worker); that dump is faulthandler's C handler,
so it is written wherever the worker is, holding the GIL or not.

NOTE [ Stacks on request ]
A stalled worker's stack (the stall report) is asked for over a pipe that the worker's parent
watch reads (``entry._watch_parent``, a bare thread): it dumps every thread but itself with
``faulthandler.dump_traceback``. No signal handler is installed for it, so a worker's signal
dispositions, down to ``/proc/self/status``'s caught set, are torch's. The price: a worker
stuck in native code that holds the GIL does not answer (the report says so); code blocked in
I/O, a lock, ``sleep`` or a C call that releases the GIL (Pillow, OpenCV, numpy) does.

NOTE [ The stack signal ]
The doctor samples the workers' stacks many times a second from outside the loader
(``doctor/worker_stacks.py``) and needs the dump without the GIL, so that a sample is not
biased towards code that releases it: only while it measures (``stacks_by_signal``) do the
workers it starts also register a real-time signal, ``SIGRTMAX - 2``, with faulthandler. Not
``SIGUSR1``: what a worker does on SIGUSR1 is a program's (a job scheduler sends it before a
time limit; Lightning handles it; by default it ends the process), and torch's worker leaves
it alone. Python's signal table (``signal.getsignal``) does not see faulthandler's handler,
and an ``exec`` resets it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import NamedTuple

from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers

from stoker.transport import segments

DUMP_SIGNAL = signal.SIGRTMAX - 2  # NOTE [ The stack signal ]
_DUMP_WAIT_S = 1.0
_POLL_S = 0.02


_by_signal = 0  # doctor sessions in this process that want the signal (NOTE [ The stack signal ])


@contextlib.contextmanager
def stacks_by_signal() -> Iterator[None]:
    """Workers started inside this block also dump their stacks on ``DUMP_SIGNAL``."""
    global _by_signal
    _by_signal += 1
    try:
        yield
    finally:
        _by_signal -= 1


def signal_wanted() -> bool:
    """Whether a worker started now should register ``DUMP_SIGNAL`` (goes in its spec)."""
    return _by_signal > 0


class StackLog(NamedTuple):
    """A worker's side of its stacks: the log, the pipe requests come through, and whether a
    crash writes to the log."""

    fd: int | None  # None off Linux: stacks go to stderr as usual
    requests: int | None  # read end, for the parent watch (NOTE [ Stacks on request ])
    ask_end: int | None  # write end: sent to the main process, then closed here
    crash_stacks: bool


def install_in_worker(by_signal: bool = False) -> StackLog:
    """Open this worker's stack log and request pipe; turn crash dumps to the log where
    faulthandler is on, and register ``DUMP_SIGNAL`` where the doctor asked (``by_signal``).

    NOTE [ faulthandler as the parent left it ]
    torch's worker has faulthandler as its parent left it (fork) or as the interpreter's
    flags set it (spawn: ``-X faulthandler``, ``PYTHONFAULTHANDLER``), and
    ``faulthandler.is_enabled()`` there is a thing a dataset can read, as is the set of
    signals ``/proc/self/status`` lists as caught. So a worker turns faulthandler's crash
    dump on only where it is already on, and then only changes the file it writes to: the
    log, which the main process's error quotes and writes on stderr, where torch's worker
    writes it (``engine.worker_death``). Where it is off, a crashed worker's error
    says how to get its Python stack instead. Stacks on request need no handler (NOTE
    [ Stacks on request ]).
    """
    fd = segments.create_log()
    if fd is None:
        return StackLog(None, None, None, False)  # pragma: no cover - non-Linux
    # Not imported where the program left it out (a dataset can see sys.modules): it is
    # imported whenever it was enabled (-X faulthandler, PYTHONFAULTHANDLER, enable())
    loaded = sys.modules.get("faulthandler")
    crash_stacks = loaded is not None and loaded.is_enabled()
    if crash_stacks or by_signal:
        import faulthandler
    if crash_stacks:
        # enable() would only change the file, and torch's handlers, set first, would run
        # alone on a crash. Disabling restores what faulthandler replaced in the parent, which
        # drops torch's handlers: set them again, so that faulthandler's dump chains to them.
        faulthandler.disable()
        _set_worker_signal_handlers()
        faulthandler.enable(file=fd, all_threads=True)
    if by_signal:
        faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
    requests, ask_end = os.pipe()
    return StackLog(fd, requests, ask_end, crash_stacks)


def answer_request(log_fd: int) -> None:
    """Dump every thread's stack to the log: called by the parent watch, whose own frame the
    reader drops (``_others``)."""
    import faulthandler

    faulthandler.dump_traceback(file=log_fd, all_threads=True)


def request_stacks(ask_fd: int, log_fd: int) -> str:
    """Ask a live worker for its stacks and return them; empty if it does not answer in 1 s
    (gone, or stuck in native code that holds the GIL: NOTE [ Stacks on request ])."""
    start = os.fstat(log_fd).st_size
    try:
        os.write(ask_fd, b"s")
    except OSError:  # the worker is gone (EPIPE), or has not read its earlier requests
        return ""
    deadline = time.monotonic() + _DUMP_WAIT_S
    last = start
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        size = os.fstat(log_fd).st_size
        if size > start and size == last:
            break  # written and no longer growing
        last = size
    return _others(segments.read_log(log_fd, start)) if last > start else ""


def _others(dump: str) -> str:
    """A faulthandler dump without the dumping thread's block (``Current thread ...``) and the
    parked threads that stand in for torch's (NOTE [ torch's feeder thread in a worker ])."""
    blocks = dump.strip("\n").split("\n\n")
    return "\n\n".join(b for b in blocks if not b.startswith("Current thread ")
                       and "feeder_stand_in.py" not in b)
