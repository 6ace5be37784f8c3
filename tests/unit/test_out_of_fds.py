"""NOTE [ Out of file descriptors ]: a batch sent torch's way to a main process with no file
descriptor left for it is torch's error when due (its type and text), the original as its
cause, with a note naming the limit and ``slab_transport``; both ways it can fail: the fds
not received (the kernel drops them), or received and not duplicated by torch's rebuild."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
import torch

from stoker.transport import torch_way
from stoker.workers import protocol as msg

TORCH_TEXT = (
    "Too many open files. Communication with the workers is no longer possible. Please "
    "increase the limit using `ulimit -n` in the shell or change the sharing strategy by "
    "calling `torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of "
    "your code")
_REPORT = msg.BatchReport(
    concurrency=1, fetch_wall_s=0.0, fetch_cpu_s=0.0, collate_s=0.0, pack_s=0.0, decisions=(),
    batched="", queued_s=0.0, gives_back=True, init_fn_seeded=False, packed_at=0.0,
)


@contextlib.contextmanager
def free_slots(n: int) -> Iterator[int]:
    """The open-files limit lowered so that exactly ``n`` more fds can be opened; the limit."""
    probes = [os.open(os.devnull, os.O_RDONLY) for _ in range(n)]
    for fd in probes:
        os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = max(probes) + 1  # below it, only the n lowest free numbers are free
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _received_with(slots: int) -> tuple[BaseException, int]:
    """A two-tensor batch sent torch's way and received with ``slots`` fds free."""
    a, b = socket.socketpair()
    worker, main = Connection(a.detach()), Connection(b.detach())
    try:
        payload, fds, _ = torch_way.dumps([torch.zeros(2), torch.ones(3)])
        msg.send(worker, msg.Done(epoch=0, task_id=0, segment_id=None, used=0, payload=payload,
                                  retired=[], skipped=[], report=_REPORT, fds=len(fds)))
        msg.send_fds(worker, fds)
        torch_way.close(fds)
        with free_slots(slots) as limit:
            done = msg.recv_from_worker(main)
        assert isinstance(done, msg.Done) and isinstance(done.payload, torch_way.Unpickled)
        assert done.payload.batch is None and done.payload.error is not None
        return done.payload.error, limit
    finally:
        worker.close()
        main.close()


@pytest.mark.parametrize(("slots", "cause"), [
    (1, OSError),  # one of the two fds received: the kernel drops the other
    (2, RuntimeError),  # both received, none left for torch's rebuild to duplicate one
])
def test_a_batch_with_no_fd_left_for_it_is_torchs_error(slots, cause):
    error, limit = _received_with(slots)
    assert type(error) is RuntimeError
    assert str(error) == TORCH_TEXT
    assert error.__notes__ == [
        "stoker: each tensor of a batch from the workers keeps a file descriptor open while "
        f"the batch is held (as under torch), and this process may have {limit} open "
        "(`ulimit -n`). Hold fewer batches (keep copies: `t.clone()`, or `t.tolist()`), or "
        "pass beyond_torch={'slab_transport'} to stoker.DataLoader: batches then arrive in "
        "reused shared-memory slabs, with no file descriptor per batch."]
    assert type(error.__cause__) is cause
    if cause is OSError:
        assert error.__cause__.errno == errno.EMFILE
    else:
        assert str(error.__cause__) == "could not duplicate a shared memory file descriptor"


def test_other_errors_of_a_batch_are_left_as_they_are():
    exc = RuntimeError("something else")
    assert torch_way.out_of_fds(exc) is exc
