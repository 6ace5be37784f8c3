"""The worker process: a small loop that fetches, collates into shared memory and replies.

Setup mirrors torch's worker (seeding, ``get_worker_info``, one intra-op thread,
``worker_init_fn`` once per start, its error deferred to the first task). See
``messages`` for the protocol and NOTE [ Loader shutdown ] in ``_runtime.shutdown``.
"""

from __future__ import annotations

import os
import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.collate import allocating_into
from stoker.executors import diagnostics
from stoker.executors import messages as msg
from stoker.executors.fetch import make_fetcher
from stoker.executors.remote_errors import RemoteError, capture, describe_indices
from stoker.executors.thread_caps import cap_worker_threads
from stoker.executors.worker_info import set_worker_info
from stoker.sampling.seeds import batch_seed, seed_global_rngs, seed_worker_rngs
from stoker.transport import segments
from stoker.transport.segments import SegmentRef
from stoker.transport.slab_writer import SlabPool, write_batch

_PARENT_CHECK_INTERVAL_S = 0.5


def _watch_parent(parent_pid: int) -> None:
    """Exit when the main process is gone, even if the user's code is stuck in a fetch."""
    stop = threading.Event()
    while not stop.wait(_PARENT_CHECK_INTERVAL_S):
        if os.getppid() != parent_pid:
            os._exit(0)


class _Worker:
    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.epoch = spec.first_epoch
        self.retired: list[int] = []
        self.exhausted = False
        self.init_error: RemoteError | None = None
        self.pool = SlabPool(self._announce, spec.max_idle_slabs)
        self.fetcher: Any = None

    def _announce(self, fd: int, ref: SegmentRef) -> None:
        self.conn.send((msg.SLAB, ref))
        if ref.name is None:
            send_handle(self.conn, fd, self.spec.parent_pid)

    def start(self) -> None:
        spec = self.spec
        seed = seed_worker_rngs(spec.base_seed, spec.worker_id)
        rank, world = 0, 1
        if spec.dist is not None:
            # Spawned workers inherit neither the process group nor torchrun's variables.
            from stoker.distributed.context import set_context

            set_context(spec.dist)
            rank, world = spec.dist.rank, spec.dist.world_size
        set_worker_info(spec.worker_id, spec.num_workers, seed, spec.fetch.dataset, rank, world)
        try:
            if spec.worker_init_fn is not None:
                spec.worker_init_fn(spec.worker_id)
            self.fetcher = make_fetcher(spec.fetch)
        except Exception as exc:
            self.init_error = capture(
                exc, spec.worker_id, "starting (worker_init_fn or iter(dataset))"
            )

    def reset(self, epoch: int, released: list[int]) -> None:
        self.epoch = epoch
        self.retired += self.pool.release(released)
        self.exhausted = False
        if self.init_error is None:
            try:
                self.fetcher = make_fetcher(self.spec.fetch)
            except Exception as exc:
                self.init_error = capture(
                    exc, self.spec.worker_id, "starting an epoch (iter(dataset))"
                )

    def run_task(self, task_id: int, indices: Any) -> None:
        if self.exhausted:
            return  # like torch: tasks after the end of an iterable are ignored
        if self.init_error is not None:
            self.conn.send((msg.FAILED, self.epoch, task_id, self.init_error))
            return
        if self.spec.seed_per_batch:
            seed_global_rngs(batch_seed(self.spec.base_seed, self.epoch, task_id))
        slab = self.pool.acquire()
        try:
            with allocating_into(slab):
                batch = self.fetcher.fetch(indices)
            segment_id, used, payload = write_batch(self.pool, slab, batch)
        except StopIteration:  # only iterables: map fetchers turn it into an error
            self.pool.release_one(slab)
            self.exhausted = True
            self.conn.send((msg.EXHAUSTED, self.epoch, task_id))
            return
        except Exception as exc:
            self.pool.release_one(slab)
            err = capture(exc, self.spec.worker_id, "loading " + describe_indices(indices))
            self.conn.send((msg.FAILED, self.epoch, task_id, err))
            return
        del batch
        skipped = self.fetcher.skipped
        reply = (msg.DONE, self.epoch, task_id, segment_id, used, payload, self.retired, skipped)
        self.conn.send(reply)
        self.retired = []

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return  # the main process is gone
            tag = message[0]
            if tag == msg.TASK:
                _, epoch, task_id, indices, released = message
                self.retired += self.pool.release(released)
                if epoch == self.epoch:
                    self.run_task(task_id, indices)
            elif tag == msg.RESET:
                self.reset(message[1], message[2])
            else:
                return


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process."""
    # Ctrl-C goes to the whole process group; the main process handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    segments.close_inherited()
    from stoker.executors import process_pool

    process_pool.close_inherited_parent_ends()
    threading.Thread(target=_watch_parent, args=(spec.parent_pid,), daemon=True).start()
    cap_worker_threads(1)
    worker = _Worker(spec, conn)
    try:
        log_fd = diagnostics.install_in_worker()
        conn.send((msg.HELLO, log_fd is not None))
        if log_fd is not None:
            send_handle(conn, log_fd, spec.parent_pid)
        worker.start()
        worker.serve()
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass
    finally:
        worker.pool.close()
        conn.close()
