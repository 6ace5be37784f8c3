"""A real forked worker driven through its socket by the test, which plays the main process:
for tests of the worker's side of the protocol (``stoker.workers.protocol``)."""

from __future__ import annotations

import multiprocessing
import os

from _engine_datasets import BLOCK_S
from torch.utils.data import default_collate

from stoker._core.specs import FetchSpec, WorkerSpec
from stoker.engine.base_iter import resolve_collate
from stoker.workers import protocol as msg
from stoker.workers.launch import start_worker


class PlayedMain:
    """Plays the main process for one real forked worker: sends messages, reads replies."""

    def __init__(self, dataset) -> None:
        ctx = multiprocessing.get_context("fork")
        fetch = FetchSpec(dataset, "map", True, resolve_collate(default_collate), False,
                          beyond=frozenset({"slab_transport"}))
        spec = WorkerSpec(
            worker_id=0, num_workers=1, fetch=fetch, base_seed=1, worker_init_fn=None,
            max_idle_slabs=4, parent_pid=os.getpid(), first_epoch=0, seed_per_batch=True,
            concurrency=1,
        )
        self.handle = start_worker(ctx, spec)
        self.fds: list[int] = []  # received from the worker (its stack log, memfd slabs...)
        self.slabs_made = 0

    def send(self, message) -> None:
        msg.send(self.handle.conn, message)

    def reply(self) -> tuple:
        """The next reply that is not a HELLO or a new slab (their fds are taken and kept)."""
        conn = self.handle.conn
        while True:
            assert conn.poll(BLOCK_S), "the worker did not answer"
            message = msg.recv_from_worker(conn)
            if isinstance(message, msg.Hello):
                if message.has_log:  # its stack log and its request pipe's write end
                    self.fds.extend(msg.recv_fds(conn, 2))
            elif isinstance(message, msg.Slab):
                self.slabs_made += 1
                if message.ref.name is None:
                    self.fds.append(msg.recv_fd(conn))
            else:
                return message

    def stop(self) -> None:
        self.send(msg.Stop())
        self.handle.process.join(BLOCK_S)
        assert self.handle.process.exitcode == 0
        self.handle.conn.close()
        self.handle.process.close()
        for fd in self.fds:
            os.close(fd)


def tag_and_task(reply):
    return reply.tag, reply.task_id
