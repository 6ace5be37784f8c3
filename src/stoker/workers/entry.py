"""A worker process's entry points: set the process up, run its ``Worker``, clean up.

``launch.start_worker`` starts a process at ``worker_main`` (fork) or ``worker_main_once``
(spawn/forkserver, NOTE [ Pickle once ] in ``workers.spec_once``); the loop itself is
``workers.main_loop.Worker``. This module also keeps the main process's ends of the worker
sockets, which a forked worker closes so that the main process's death reaches every worker
as end-of-file.

NOTE [ The worker's process is torch's ]
What a dataset can see of the process it runs in is what torch's ``_worker_loop`` gives it
(the audit: docs/same_as_torch.md, "The process and the voice"). Each worker first installs
torch's own C handlers for SIGBUS, SIGSEGV, SIGFPE and SIGTERM (a SIGTERM from the parent
exits quietly) and names its thread ``pt_data_worker`` (``ps``, ``top``, ``/proc/<pid>/comm``),
as torch's worker does; its process object is made in worker-id order without a name, so
``multiprocessing.current_process().name`` is ``Process-N`` as under torch. SIGINT keeps the
disposition the worker inherited, as in torch's worker: an ignored SIGINT would survive
``exec`` into every program the dataset starts (a tool started with ``subprocess.run`` would
no longer stop on Ctrl-C), so a Ctrl-C reaches the worker as ``KeyboardInterrupt``, which
ends it quietly wherever it lands, as torch's does; the main process gets its own and stops
the rest. After the workers start, the main process gets torch's SIGCHLD handler, as torch's
iterator sets it (stoker registers no pids with it: deaths are reported by stoker's own
watch). stoker's own additions are invisible to a program that succeeds: faulthandler stays as
the parent left it, writing to an in-memory log where it was on (NOTE [ faulthandler as the
parent left it ]), no signal handler is added (stacks are asked for through a pipe the parent
watch reads: NOTE [ Stacks on request ]), and the parent watch is a bare ``_thread`` thread,
outside ``threading``'s registry and its name counter (only ``/proc/self/task`` counts it);
the thread torch's worker has once it has sent something is stood in for (NOTE [ torch's
feeder thread in a worker ]).
"""

from __future__ import annotations

import _thread

# torch's loader makes queues and an event as it starts its workers (and its spawned workers
# unpickle them), which loads these: a dataset that looks at sys.modules finds them loaded
import multiprocessing.queues  # noqa: F401
import multiprocessing.synchronize  # noqa: F401
import os
import select
import weakref
from multiprocessing.connection import Connection
from typing import Any

import torch.multiprocessing
from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers

from stoker._core.specs import WorkerSpec
from stoker._core.torch_voice import FETCH_IN_WORKER_CALL, INIT_IN_WORKER_CALL, at_torch_call
from stoker.fastpaths.torch_collate_patch import collate_into_slabs_in_this_worker
from stoker.sampling import global_rngs
from stoker.sharing.auto_share import apply_in_worker
from stoker.transport import segments
from stoker.workers import diagnostics, feeder_stand_in
from stoker.workers import protocol as msg
from stoker.workers.main_loop import Worker
from stoker.workers.remote_errors import RemoteError, capture
from stoker.workers.thread_caps import cap_worker_threads

# The raw RNG copies' offsets (NOTE [ Raw RNG snapshots ]) and what every worker's
# apply_in_worker imports: found and loaded once here, in the main process before it forks, not
# by every worker at each start (~6 ms of calibration, and the modules' imports). Not
# numpy.random: each worker loads it as it seeds it, as torch's do (NOTE [ numpy's RNG loads
# when the program loads it ]).
global_rngs.calibrate()
# and the copies of torch's lines a worker calls the dataset from (NOTE [ torch's fetchers
# call the dataset ] in fetch.fetchers)
at_torch_call(*FETCH_IN_WORKER_CALL)
at_torch_call(*INIT_IN_WORKER_CALL)
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


def _watch_parent(main_pid: int, stacks: diagnostics.StackLog) -> None:
    """Exit when the main process is gone, even if the user's code is stuck in a fetch; answer
    the main process's requests for this worker's stacks (NOTE [ Stacks on request ])."""
    first_ppid = os.getppid()
    requests = [stacks.requests] if stacks.requests is not None else []
    while True:
        ready = select.select(requests, [], [], _PARENT_CHECK_INTERVAL_S)[0]
        if not _main_alive(main_pid, first_ppid):
            os._exit(0)
        if ready:
            if os.read(requests[0], 64) and stacks.fd is not None:
                diagnostics.answer_request(stacks.fd)
            else:  # the main process closed its end: watch only
                requests = []


def worker_main_once(handle: Any, worker_id: int, conn: Connection) -> None:
    """Entry point of a spawn/forkserver worker whose spec was pickled once for all workers
    (NOTE [ Pickle once ] in ``stoker.workers.spec_once``)."""
    try:
        _set_up_as_torch()
        try:
            spec = handle.load(worker_id)
        except Exception as exc:  # e.g. a __setstate__ that raises: the user gets this error
            doing = "unpickling the dataset and the loader's functions"
            _answer_with(capture(exc, worker_id, doing), conn)
            return
    except KeyboardInterrupt:  # NOTE [ The worker's process is torch's ]
        conn.close()
        return
    worker_main(spec, conn, set_up=False)


def _answer_with(error: RemoteError, conn: Connection) -> None:
    """A worker whose spec did not load answers every task with the error until stopped."""
    try:
        msg.send(conn, msg.Hello(has_log=False))
        while True:
            message = msg.recv_from_main(conn)
            if isinstance(message, msg.Task):
                msg.send(conn, msg.Failed(message.epoch, message.task_id, error))
                feeder_stand_in.after_put()  # NOTE [ torch's feeder thread in a worker ]
            elif isinstance(message, msg.Stop):
                return
    except (EOFError, OSError):
        return
    finally:
        conn.close()


def _set_up_as_torch() -> None:
    """What torch's ``_worker_loop`` does to its process before anything else (NOTE [ The
    worker's process is torch's ])."""
    _set_worker_signal_handlers()
    torch.multiprocessing._set_thread_name("pt_data_worker")


def worker_main(spec: WorkerSpec, conn: Connection, set_up: bool = True) -> None:
    """Entry point of a worker process."""
    try:
        if set_up:
            _set_up_as_torch()
        worker, stacks = _prepare(spec, conn)
    except KeyboardInterrupt:  # NOTE [ The worker's process is torch's ]
        conn.close()
        return
    _serve(worker, stacks, spec, conn)


def _prepare(spec: WorkerSpec, conn: Connection) -> tuple[Worker, diagnostics.StackLog]:
    segments.close_inherited()
    close_inherited_parent_ends()
    stacks = diagnostics.install_in_worker(by_signal=spec.stack_signal)
    # A bare thread: not in threading.enumerate(), no "Thread-N" number taken from the
    # names a dataset's own threads get (NOTE [ The worker's process is torch's ]).
    _thread.start_new_thread(_watch_parent, (spec.parent_pid, stacks))
    beyond = spec.fetch.beyond
    cap_worker_threads(1, forked=spec.forked, every_pool="thread_caps" in beyond)
    if spec.fetch.fast_paths and "slab_transport" in beyond:
        collate_into_slabs_in_this_worker()  # NOTE [ torch's collate in stoker workers ]
    apply_in_worker(spec.shared_lists)  # before any user code runs here
    return Worker(spec, conn), stacks


def _serve(worker: Worker, stacks: diagnostics.StackLog, spec: WorkerSpec,
           conn: Connection) -> None:
    try:
        msg.send(conn, msg.Hello(has_log=stacks.fd is not None, crash_stacks=stacks.crash_stacks))
        if stacks.fd is not None and stacks.ask_end is not None:
            msg.send_fds(conn, [stacks.fd, stacks.ask_end])
            os.close(stacks.ask_end)  # the main process holds it now
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
