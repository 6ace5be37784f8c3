"""Shutdown paths: nothing survives break, exceptions, GC, Ctrl-C or a killed main process.

The autouse leak check in conftest.py verifies processes, threads, fds and /dev/shm after every
test here; these tests add the paths that need a separate main process.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch

import stoker
from stoker.engine.prefetch_depth import _SMALL_BATCH_DEPTH

WAIT_S = 30


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": torch.full((8,), float(i)), "i": i}


class Failing(Squares):
    def __getitem__(self, i):
        if i == 20:
            raise ValueError("bad sample 20")
        return super().__getitem__(i)


def test_break_mid_epoch_stops_workers():
    loader = stoker.DataLoader(Squares(), batch_size=4, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break


def test_exception_mid_epoch_then_gc_stops_workers():
    loader = stoker.DataLoader(Failing(), batch_size=4, num_workers=2)
    with pytest.raises(ValueError, match="bad sample 20"):
        for _ in loader:
            pass


class Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        i = 0
        while True:
            yield torch.full((8,), float(i))
            i += 1


@pytest.mark.parametrize("dataset", [Squares(), Endless()], ids=["map", "iterable"])
def test_an_abandoned_iterator_stops_its_workers_as_its_last_reference_goes(dataset):
    """As torch's: no reference cycle keeps the iterator (and its busy workers, which would
    take CPU from the next epoch's) alive until the garbage collector runs."""
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    pids = [w.pid for w in it._group.workers]
    gc.disable()
    try:
        del it
        _, alive = psutil.wait_procs(
            [p for p in map(_process_or_none, pids) if p is not None], timeout=WAIT_S)
    finally:
        gc.enable()
    assert not alive, f"workers {[p.pid for p in alive]} outlived their iterator"


class HeldAtBatchOne(torch.utils.data.Dataset):
    """Notes each index it reads in ``log``; the first index of batch 1 sets ``started`` and
    waits for ``go``."""

    def __init__(self, log, go, started):
        self.log, self.go, self.started = log, go, started

    def __len__(self):
        return 64

    def __getitem__(self, i):
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        if i == 4:
            self.started.set()
            assert self.go.wait(WAIT_S), "never let go"
        return i


def test_a_worker_asked_to_stop_does_not_start_the_batches_queued_before_the_stop(
    tmp_path, monkeypatch
):
    """Shutdown waits for the batch a worker is in, not for those queued behind it (torch's
    workers skip every index once their done_event is set): a loader abandoned after its
    first batch, while its one worker holds batch 1 with batches 2-4 queued, reads nothing
    past batch 1."""
    from stoker.workers import launch

    go, started = (torch.multiprocessing.get_context("fork").Event() for _ in range(2))
    asked = launch.WorkerHandle.ask_to_stop

    def ask_then_let_go(handle):  # STOP is in the socket, behind the queued tasks
        asked(handle)
        go.set()

    monkeypatch.setattr(launch.WorkerHandle, "ask_to_stop", ask_then_let_go)
    log = tmp_path / "read.log"
    loader = stoker.DataLoader(HeldAtBatchOne(str(log), go, started), batch_size=4,
                               num_workers=1, prefetch_factor=4, multiprocessing_context="fork")
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    # In batch 1 before the stop is asked: a worker that had not begun it skips it too.
    assert started.wait(WAIT_S)
    del it
    assert go.is_set()
    assert sorted(int(x) for x in log.read_text().split()) == list(range(8))


def _process_or_none(pid):
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_deleting_a_loader_with_persistent_workers_stops_them():
    loader = stoker.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(2):
        assert sum(len(b["i"]) for b in loader) == 64
    pids = [w.pid for w in loader._iterator._group.workers]
    assert all(psutil.pid_exists(p) for p in pids) and len(pids) == 2
    del loader
    gc.collect()


def test_batches_held_after_the_loader_is_gone_stay_valid_and_hold_no_fds():
    fds_before = len(os.listdir("/proc/self/fd"))
    loader = stoker.DataLoader(Squares(), batch_size=1, num_workers=2,
                               beyond_torch={"slab_transport"})
    held = list(loader)
    del loader
    gc.collect()
    assert len(held) == 64
    assert all(torch.equal(b["x"], torch.full((1, 8), float(i))) for i, b in enumerate(held))
    # 64 live batches, and not one fd for them (torch's file_descriptor strategy needs 64+)
    assert len(os.listdir("/proc/self/fd")) <= fds_before


def _slab_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("stoker-slab" in line for line in f)


def test_slab_mappings_are_gone_once_loader_and_batches_are():
    loader = stoker.DataLoader(Squares(), batch_size=2, num_workers=2, persistent_workers=True,
                               beyond_torch={"slab_transport"})
    list(loader)
    held = list(loader)  # all of them kept: their slabs cannot be reused
    assert _slab_mappings() > 0
    del loader
    gc.collect()
    # the workers are gone; the held batches still read their slabs
    assert torch.equal(torch.cat([b["x"][:, 0] for b in held]), torch.arange(64.0))
    del held
    gc.collect()
    assert _slab_mappings() == 0


def test_workers_exit_at_the_end_of_the_epoch():
    # as torch's: alive until the epoch ends (test_same_as_torch_by_default checks they are
    # alive after the last batch), then stopped by the StopIteration
    loader = stoker.DataLoader(Squares(), batch_size=8, num_workers=2)
    it = iter(loader)
    held = [next(it) for _ in range(len(loader))]  # every batch, but no StopIteration yet
    processes = [psutil.Process(w.pid) for w in it._group.workers]
    assert all(p.is_running() for p in processes)
    with pytest.raises(StopIteration):
        next(it)
    gone, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive, "the workers did not exit at the end of the epoch"
    assert torch.equal(torch.cat([b["i"] for b in held]), torch.arange(64))


def test_persistent_workers_stay_after_the_last_batch():
    loader = stoker.DataLoader(Squares(), batch_size=8, num_workers=2, persistent_workers=True)
    it = iter(loader)
    held = [next(it) for _ in range(len(loader))]
    procs = [psutil.Process(w.pid) for w in it._group.workers]
    with pytest.raises(StopIteration):
        next(it)
    assert all(p.is_running() for p in procs)
    assert len(list(loader)) == len(held)
    del it, loader
    gc.collect()


class ManySquares(Squares):
    def __len__(self):
        return 600


def test_slabs_are_reused_across_an_epoch():
    loader = stoker.DataLoader(ManySquares(), batch_size=2, num_workers=2, prefetch_factor=2,
                               beyond_torch={"slab_transport"})
    it = iter(loader)
    most = 0
    for _ in it:
        most = max(most, len(it._group.reader._slabs))
    # 300 batches went through; the slabs known at once stay bounded by the task depth,
    # however many batches pass (measured 18-26). These batches are small, so the depth is
    # NOTE [ Deeper prefetch for small batches ]'s. Per worker: tasks in flight or waiting to
    # be yielded, as many released slabs whose release rides the worker's next task, the idle
    # slabs it keeps (prefetch_factor) and the batch held here.
    assert most <= 2 * (2 * _SMALL_BATCH_DEPTH + 2 + 1)
    assert most < 300 / 4


_CHILD = textwrap.dedent(
    """
    import os, sys, threading, torch, stoker
    class Slow(torch.utils.data.Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i):
            threading.Event().wait(0.05)  # keep the workers busy while the parent is stopped
            return torch.ones(4)
    loader = stoker.DataLoader(Slow(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    print(" ".join(str(w.pid) for w in it._group.workers), flush=True)
    for _ in it:
        pass
    """
)


def _start_child():
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, [int(p) for p in line.split()]


def _wait_gone(pids):
    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    _, alive = psutil.wait_procs(procs, timeout=WAIT_S)
    return [p.pid for p in alive]


def test_ctrl_c_in_the_main_process_stops_workers():
    proc, pids = _start_child()
    os.killpg(proc.pid, signal.SIGINT)  # like a terminal: the whole process group
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert _wait_gone(pids) == []


def test_workers_exit_when_the_main_process_is_killed():
    proc, pids = _start_child()
    proc.kill()
    proc.communicate(timeout=WAIT_S)
    assert _wait_gone(pids) == []
