"""Holding batches costs no file descriptors; running out of them says what to do.

torch keeps a file descriptor per shared tensor, so a loop that keeps its batches runs out at
``ulimit -n`` (torch's test_fd_limit_exceeded). A stoker slab is a mapping without an fd in
both processes, whatever the number of batches held.
"""

from __future__ import annotations

import os
import resource

import psutil
import pytest
import torch

import stoker


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((2, 2), float(i))


def _open_fds(pid: int) -> int:
    return psutil.Process(pid).num_fds()


def test_held_batches_hold_no_file_descriptors():
    loader = stoker.DataLoader(_Stream(300), batch_size=None, num_workers=1, timeout=60,
                               beyond_torch={"slab_transport"})
    it = iter(loader)
    held = [next(it)]
    worker_pid = it._group.workers[0].pid
    main_before, worker_before = _open_fds(os.getpid()), _open_fds(worker_pid)
    main_at = worker_at = -1
    for batch in it:
        held.append(batch)
        if len(held) == 250:
            main_at, worker_at = _open_fds(os.getpid()), _open_fds(worker_pid)
    assert len(held) == 300
    assert [int(b[0, 0]) for b in held] == list(range(300))
    # Every held batch is in a slab of its own (none came back): 250 slabs, no fd each.
    assert main_at - main_before < 10
    assert worker_at - worker_before < 10


class _OpensNoMore(_Stream):
    """In its worker, as it starts yielding, no further file can be opened: a new fd takes the
    lowest free number, and the limit is set to it."""

    def __iter__(self):
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (lowest_free, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        return super().__iter__()


def test_running_out_of_file_descriptors_says_what_to_change():
    loader = stoker.DataLoader(_OpensNoMore(4), batch_size=2, num_workers=1, timeout=60,
                               beyond_torch={"slab_transport"})
    with pytest.raises(OSError) as info:
        list(loader)
    text = str(info.value)
    assert "shared-memory slab" in text and "Too many open files" in text
    assert "ulimit -n" in text and "may have at most" in text
