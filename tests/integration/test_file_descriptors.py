"""Holding batches costs no file descriptors; running out of them says what to do.

torch keeps a file descriptor per shared tensor, so a loop that keeps its batches runs out at
``ulimit -n`` (torch's test_fd_limit_exceeded). A stoker slab is a mapping without an fd in
both processes, whatever the number of batches held.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

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


def _held_until_out_of_fds(which: str, tensors: int) -> dict:
    script = Path(__file__).with_name("_fd_limit_script.py")
    done = subprocess.run([sys.executable, str(script), which, str(tensors)],
                          capture_output=True, text=True, timeout=180, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tensors", [1, 2])
def test_holding_batches_past_the_fd_limit_gives_torchs_error_and_the_slabs(tensors):
    """NOTE [ Out of file descriptors ]: torch's RuntimeError and text (raise `ulimit -n`, or
    the file_system sharing strategy), plus a note naming the limit and slab_transport. With
    two tensors a batch, the last batch's fds may not all be received (an odd number of free
    slots), or received and not duplicated."""
    theirs = _held_until_out_of_fds("torch", tensors)
    ours = _held_until_out_of_fds("stoker", tensors)
    assert theirs["type"] == "RuntimeError"
    assert ours["type"] == theirs["type"]
    assert ours["text"] == theirs["text"] == (
        "Too many open files. Communication with the workers is no longer possible. Please "
        "increase the limit using `ulimit -n` in the shell or change the sharing strategy by "
        "calling `torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning "
        "of your code")
    assert ours["notes"] == [
        "stoker: each tensor of a batch from the workers keeps a file descriptor open while "
        f"the batch is held (as under torch), and this process may have {ours['limit']} open "
        "(`ulimit -n`). Hold fewer batches (keep copies: `t.clone()`, or `t.tolist()`), or "
        "pass beyond_torch={'slab_transport'} to stoker.DataLoader: batches then arrive in "
        "reused shared-memory slabs, with no file descriptor per batch."]
    assert ours["cause"] in (
        "RuntimeError: could not duplicate a shared memory file descriptor",
        "OSError: [Errno 24] Too many open files: the main process had no file descriptor left "
        "to receive a worker's shared memory (as under torch, each tensor of a batch you hold "
        "keeps one open); raise the limit (`ulimit -n`), keep fewer batches, call "
        "torch.multiprocessing.set_sharing_strategy('file_system') as torch's docs advise, or "
        "pass beyond_torch={'slab_transport'} (no descriptor per batch)")
    assert 0 < ours["held"] < ours["limit"]
