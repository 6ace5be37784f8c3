"""Notice a dead worker at once and say what probably killed it."""

from __future__ import annotations

import signal
from typing import Any

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


def _crash_stacks(it: Any, w: Any) -> str:
    fd = it._group.stack_logs.get(w.worker_id)
    if fd is None or w.process.exitcode >= 0 or -w.process.exitcode not in _FATAL_SIGNALS:
        return ""
    text = segments.read_log(fd).strip()
    return f"\nThe worker's faulthandler output:\n{text}\n" if text else ""


def _shm_note(exitcode: int) -> str:
    if exitcode != -signal.SIGBUS:
        return ""
    free = segments.dev_shm_free_bytes()
    return f" /dev/shm has {free / 2**20:.0f} MiB free now." if free is not None else ""


def check_workers_alive(it: Any) -> None:
    """Raise ``WorkerDiedError`` if any worker of iterator ``it`` has exited."""
    dead = [w for w in it._group.workers if w.process.exitcode is not None and not w.stop_sent]
    if not dead:
        return
    lines = []
    for w in dead:
        for reply in it._group.drain(w):  # it may have replied before dying; keep those
            it._file_reply(w, reply)
        held = [i for t, i in it._task_indices.items() if it._task_worker.get(t) == w.worker_id]
        what = describe_indices([j for i in held for j in (i if isinstance(i, list) else [i])])
        line = _describe_exit(w) + (f", loading {what}." if held else ".")
        cause = _LIKELY_CAUSE.get(-w.process.exitcode) if w.process.exitcode < 0 else (
            "A worker exits like this when dataset code calls sys.exit()/os._exit()."
        )
        if cause:
            line += " " + cause
        line += _shm_note(w.process.exitcode) + _crash_stacks(it, w)
        lines.append(line)
    it._shutdown()
    lines.append("The epoch stops here instead of silently ending short.")
    raise WorkerDiedError(" ".join(lines))


def lost_worker(it: Any, w: Any) -> None:
    """A worker's socket broke: it died mid-reply. Wait for its exit status and report it."""
    w.process.join(1.0)
    check_workers_alive(it)
    it._shutdown()
    raise WorkerDiedError(
        f"DataLoader worker {w.worker_id} (pid {w.pid}) closed its connection without exiting."
    )
