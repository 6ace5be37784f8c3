"""Notice a dead worker at once and say what probably killed it."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from stoker.engine.task_book import TaskBook
from stoker.engine.worker_group import WorkerGroup
from stoker.errors import WorkerDiedError
from stoker.transport import segments
from stoker.workers.remote_errors import describe_indices

_LIKELY_CAUSE = {
    signal.SIGKILL: (
        "SIGKILL usually comes from the out-of-memory killer (check `dmesg` or the container's "
        "memory limit); reduce num_workers, batch_size or prefetch_factor, or hold dataset "
        "metadata in numpy arrays instead of Python lists."
    ),
    signal.SIGBUS: (
        "SIGBUS in a data loader usually means shared memory ran out (a small /dev/shm, e.g. "
        "Docker's 64 MiB default); start the container with --shm-size=8g or --ipc=host."
    ),
    signal.SIGSEGV: (
        "SIGSEGV is a crash in native code called by the dataset or collate_fn (an extension "
        "module, OpenCV, a decoder); run with num_workers=0 to see it in the main process."
    ),
}


def _describe_exit(w: Any) -> str:
    """torch's first sentence (what users search for), then which worker it was."""
    exitcode = w.process.exitcode
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = signal.strsignal(-exitcode) or name
        return (f"DataLoader worker (pid {w.pid}) is killed by signal: {text}. "
                f"It was worker {w.worker_id} ({name})")
    return (f"DataLoader worker (pid {w.pid}) exited unexpectedly with code {exitcode}. "
            f"It was worker {w.worker_id}")


_FATAL_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT, signal.SIGILL}


def _crash_stacks(group: WorkerGroup, w: Any) -> str:
    fd = group.stack_logs.get(w.worker_id)
    if fd is None or w.process.exitcode >= 0 or -w.process.exitcode not in _FATAL_SIGNALS:
        return ""
    if w.worker_id not in group.crash_stacks:  # NOTE [ faulthandler as the parent left it ]
        return ("\nFor the worker's Python stack in this report, run with faulthandler on "
                "(`python -X faulthandler`, or PYTHONFAULTHANDLER=1).")
    raw = segments.read_log(fd)
    _write_as_the_worker_would(raw)
    text = raw.strip()
    return f"\nThe worker's faulthandler output:\n{text}\n" if text else ""


def _write_as_the_worker_would(dump: str) -> None:
    """A crashed worker's faulthandler dump, on stderr, where torch's worker writes it (its
    faulthandler is the parent's, on stderr): stoker's went to the log the report quotes, and a
    program that catches the error would otherwise see nothing on stderr (NOTE [ faulthandler
    as the parent left it ] in ``workers.diagnostics``)."""
    if not dump:
        return
    try:
        sys.stderr.flush()
        os.write(2, dump.encode("utf-8", "replace"))
    except (OSError, ValueError, AttributeError):  # no stderr (pythonw, closed): the report has it
        pass


def _shm_note(exitcode: int) -> str:
    if exitcode != -signal.SIGBUS:
        return ""
    free = segments.dev_shm_free_bytes()
    return f" /dev/shm has {free / 2**20:.0f} MiB free now." if free is not None else ""


FileReply = Callable[[Any, Any], None]
# processes that unpickle their arguments before any of stoker's code runs in them
_PICKLED_STARTS = ("SpawnProcess", "ForkServerProcess")


class DeathWatch:
    """Reports a dead worker of ``group``: what it held (``book``), its signal and the likely
    cause. ``file_reply`` keeps the replies it sent before dying; ``stop`` ends the epoch.

    It keeps no bound method of the iterator (``stop`` is the iterator's finalizer): a cycle
    back to the iterator would keep an abandoned one, and its busy workers, alive until the
    garbage collector runs, where torch's stop as the last reference goes."""

    def __init__(self, group: WorkerGroup, stop: Callable[[], Any]) -> None:
        self.group = group
        self.stop = stop

    def check(self, book: TaskBook, file_reply: FileReply) -> None:
        """Raise ``WorkerDiedError`` if any worker has exited unasked."""
        check_workers_alive(self, book, file_reply)

    def lost(self, book: TaskBook, w: Any, file_reply: FileReply, waiting: bool = True) -> None:
        """A worker's socket broke: it died mid-reply. Wait for its exit status, report it
        (not while sending, ``waiting=False``, nor while the next batch is in, for a worker
        that exited with 0: NOTE [ A worker that exited with code 0 ])."""
        w.process.join(1.0)
        if check_workers_alive(self, book, file_reply, waiting):
            return
        self.stop()
        raise WorkerDiedError(
            f"DataLoader worker {w.worker_id} (pid {w.pid}) closed its connection without "
            "exiting."
        )


# NOTE [ A worker that exited with code 0 ]
# torch learns of a dead worker two ways: its SIGCHLD handler raises at once, in whatever the
# main thread runs, for a worker killed by a signal or exited with another code than 0; a
# worker that exited with 0 (a Ctrl-C that reached it, sys.exit() in the dataset) is only
# found when the loop has waited for data and none came (a task put on its queue meanwhile
# goes nowhere, silently), so the batches it sent before go out first. stoker finds a death at
# its next wait or at a failed send; where the dead workers all exited with 0, their replies
# are filed and, while sending or while the batch to hand out next is in, the death waits: it
# is raised at the first wait for a batch that does not come, as torch's loop raises it.


def check_workers_alive(watch: DeathWatch, book: TaskBook, file_reply: FileReply,
                        waiting: bool = True) -> bool:
    """Raise ``WorkerDiedError`` if a worker exited unasked; True (no raise) where torch's loop
    would not raise yet: not ``waiting`` for a batch (a task being sent), or the next batch
    in to hand out (NOTE [ A worker that exited with code 0 ])."""
    group = watch.group
    dead = [w for w in group.workers if w.process.exitcode is not None and not w.stop_sent]
    if not dead:
        return False
    for w in dead:
        for reply in group.drain(w):  # it may have replied before dying; keep those
            file_reply(w, reply)
    if all(w.process.exitcode == 0 for w in dead) and (not waiting or book.awaited_ready()):
        return True
    lines = []
    for w in dead:
        held = book.held_by_worker().get(w.worker_id, [])
        what = describe_indices([j for i in held for j in (i if isinstance(i, list) else [i])])
        line = _describe_exit(w) + (f", loading {what}." if held else ".")
        cause = _LIKELY_CAUSE.get(-w.process.exitcode) if w.process.exitcode < 0 else (
            "A worker exits like this when dataset code calls sys.exit()/os._exit()"
            + (", or when the new process cannot unpickle the dataset, collate_fn or "
               "worker_init_fn (its traceback is on stderr above)."
               if type(w.process).__name__ in _PICKLED_STARTS else ".")
        )
        if cause:
            line += " " + cause
        line += _shm_note(w.process.exitcode) + _crash_stacks(group, w)
        lines.append(line)
    watch.stop()
    lines.append("The epoch stops here instead of silently ending short.")
    raise WorkerDiedError(" ".join(lines))

