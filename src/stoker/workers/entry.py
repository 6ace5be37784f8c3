"""A worker process's entry points: set the process up, run its ``Worker``, clean up.

``launch.start_worker`` starts a process at ``worker_main`` (fork) or ``worker_main_once``
(spawn/forkserver, NOTE [ Pickle once ] in ``workers.spec_once``); the loop itself is
``workers.main_loop.Worker``. This module also keeps the main process's ends of the worker
sockets, which a forked worker closes so that the main process's death reaches every worker
as end-of-file.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any

# Every worker seeds numpy's global RNG (torch's contract): loaded once here, in the main process
# before it forks, not in each worker (NOTE [ Import only what the loader needs ]).
import numpy.random  # noqa: F401

from stoker._core.specs import WorkerSpec
from stoker.fastpaths.torch_collate_patch import collate_into_slabs_in_this_worker
from stoker.sampling import global_rngs
from stoker.sharing.auto_share import apply_in_worker
from stoker.transport import segments
from stoker.workers import diagnostics
from stoker.workers import protocol as msg
from stoker.workers.main_loop import Worker
from stoker.workers.remote_errors import RemoteError, capture
from stoker.workers.thread_caps import cap_worker_threads

# Likewise the raw RNG copies' offsets (NOTE [ Raw RNG snapshots ]) and what every worker's
# apply_in_worker imports: found and loaded once here, in the main process before it forks, not
# by every worker at each start (~6 ms of calibration, and the modules' imports).
global_rngs.calibrate()
import stoker.sharing.inherited_list  # noqa: E402,F401
import stoker.sharing.stand_in  # noqa: E402,F401

# Main-process ends of every worker socket (``launch.start_worker`` adds them).
parent_ends: weakref.WeakSet[Connection] = weakref.WeakSet()


def close_inherited_parent_ends() -> None:
    for conn in list(parent_ends):
        try:
            conn.close()
        except OSError:
            pass


_PARENT_CHECK_INTERVAL_S = 0.5


def _main_alive(main_pid: int, first_ppid: int) -> bool:
    # Under fork the main process is our parent; under spawn/forkserver the parent may be a
    # server process, so also ask whether the main pid still exists.
    if os.getppid() != first_ppid:
        return False
    try:
        os.kill(main_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _watch_parent(main_pid: int) -> None:
    """Exit when the main process is gone, even if the user's code is stuck in a fetch."""
    first_ppid = os.getppid()
    stop = threading.Event()
    while not stop.wait(_PARENT_CHECK_INTERVAL_S):
        if not _main_alive(main_pid, first_ppid):
            os._exit(0)


def worker_main_once(handle: Any, worker_id: int, conn: Connection) -> None:
    """Entry point of a spawn/forkserver worker whose spec was pickled once for all workers
    (NOTE [ Pickle once ] in ``stoker.workers.spec_once``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        spec = handle.load(worker_id)
    except Exception as exc:  # e.g. a __setstate__ that raises: the user gets this error
        doing = "unpickling the dataset and the loader's functions"
        _answer_with(capture(exc, worker_id, doing), conn)
        return
    worker_main(spec, conn)


def _answer_with(error: RemoteError, conn: Connection) -> None:
    """A worker whose spec did not load answers every task with the error until stopped."""
    try:
        msg.send(conn, msg.Hello(has_log=False))
        while True:
            message = msg.recv_from_main(conn)
            if isinstance(message, msg.Task):
                msg.send(conn, msg.Failed(message.epoch, message.task_id, error))
            elif isinstance(message, msg.Stop):
                return
    except (EOFError, OSError):
        return
    finally:
        conn.close()


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process."""
    # Ctrl-C goes to the whole process group; the main process handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    segments.close_inherited()
    close_inherited_parent_ends()
    threading.Thread(target=_watch_parent, args=(spec.parent_pid,), daemon=True).start()
    cap_worker_threads(1, forked=spec.forked, every_pool="thread_caps" in spec.fetch.beyond)
    if spec.fetch.fast_paths and "slab_transport" in spec.fetch.beyond:
        collate_into_slabs_in_this_worker()  # NOTE [ torch's collate in stoker workers ]
    apply_in_worker(spec.shared_lists)  # before any user code runs here
    worker = Worker(spec, conn)
    try:
        log_fd = diagnostics.install_in_worker()
        msg.send(conn, msg.Hello(has_log=log_fd is not None))
        if log_fd is not None:
            msg.send_fd(conn, log_fd)
        worker.start()
        worker.serve()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    finally:
        st = worker.state
        if os.environ.get("STOKER_DEBUG_TUNER") and st.tuner is not None:
            for d in st.tuner.decisions:
                print(f"worker {spec.worker_id}: {d}", flush=True)
        if st.pipeline is not None:
            st.pipeline.close()
        st.builder.pool.close()
        conn.close()
