"""An idle worker takes a batch queued behind a slow one (NOTE [ Idle workers take queued
tasks ]): same batches, same order, the worker that would have waited is not waited on."""

from __future__ import annotations

import pytest
import torch
from _engine_datasets import BLOCK_S, Gated, QueuedBehindSlow
from _worker_harness import PlayedMain, tag_and_task

import stoker
from stoker.workers import protocol as msg
from stoker.workers.main_loop import Inbox


@pytest.fixture(autouse=True)
def _beyond_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this module tests is beyond torch (NOTE [ Same as torch unless asked ]): asked
    for through the environment, as for a script that cannot be edited."""
    monkeypatch.setenv("STOKER_BEYOND_TORCH", "move_stragglers,per_batch_seeding")

N, BS = 24, 4
EXPECTED = [list(range(b * BS, (b + 1) * BS)) for b in range(N // BS)]


def _loader(ds, **kwargs):
    kwargs = {"batch_size": BS, "num_workers": 2, "prefetch_factor": 3, "timeout": 60,
              **kwargs}
    return stoker.DataLoader(ds, **kwargs)


def _indices(batches):
    return [b[:, 0].tolist() for b in batches]


def _workers(batches):
    return [set(b[:, 1].tolist()) for b in batches]


def test_idle_worker_takes_batch_queued_behind_slow_one():
    ds = QueuedBehindSlow(N, BS)  # without the move, batch 2 waits forever (BLOCK_S)
    loader = _loader(ds)
    batches = list(loader)
    assert _indices(batches) == EXPECTED  # torch's order, in_order=True
    assert _workers(batches)[4] == {1}  # sent to worker 0, loaded by worker 1
    assert _workers(batches)[2] == {0}
    stats = loader.stats()
    assert stats.tasks_moved >= 1
    assert ds.loads.tolist() == [1] * N  # taken back before worker 0 started it: loaded once


def test_in_any_order_every_batch_comes_once():
    ds = QueuedBehindSlow(N, BS)
    batches = list(_loader(ds, in_order=False))
    assert sorted(_indices(batches)) == EXPECTED
    by_first = {b[0, 0].item(): b for b in batches}
    assert set(by_first[EXPECTED[4][0]][:, 1].tolist()) == {1}


def test_persistent_workers_move_tasks_in_every_epoch():
    ds = QueuedBehindSlow(N, BS)
    loader = _loader(ds, persistent_workers=True)
    for epoch in range(2):
        ds.rearm()
        batches = list(loader)
        assert _indices(batches) == EXPECTED, epoch
        assert _workers(batches)[4] == {1}, epoch
    assert loader.stats().tasks_moved >= 2


def test_a_moved_batch_is_the_batch_it_would_have_been():
    # Same indices, order and augmentations as a run where nothing moves, and torch's order.
    seed = 7
    ds = QueuedBehindSlow(N, BS, slow=-1)  # nothing blocks: nothing needs to move
    plain = _loader(ds, generator=torch.Generator().manual_seed(seed))
    want = list(plain)
    ds = QueuedBehindSlow(N, BS)
    moved = _loader(ds, generator=torch.Generator().manual_seed(seed))
    got = list(moved)
    assert moved.stats().tasks_moved >= 1
    assert [g[:, [0, 2]].tolist() for g in got] == [w[:, [0, 2]].tolist() for w in want]
    torch_order = torch.utils.data.DataLoader(range(N), batch_size=BS, num_workers=2)
    assert _indices(got) == [b.tolist() for b in torch_order]


def test_per_worker_seeding_never_moves_a_task():
    # Under torch's seeding a batch's augmentations depend on the worker that loads it, so the
    # batch behind the slow one waits for worker 0 (released without it here).
    ds = QueuedBehindSlow(N, BS, release_after=N - 2 * BS)
    loader = _loader(ds, seeding="per_worker")
    batches = list(loader)
    assert _indices(batches) == EXPECTED
    assert _workers(batches)[4] == {0}
    assert loader.stats().tasks_moved == 0


def test_a_cancel_too_late_loads_the_batch_twice_and_delivers_it_once(monkeypatch):
    # A worker that reads CANCEL only after it started the task (a race in real life; here
    # every worker ignores it, and forked workers inherit the patch) loads the batch too. The
    # first copy is delivered, the second's slab is recycled, and later epochs are unaffected.
    monkeypatch.setattr(Inbox, "read_waiting", lambda self, epoch, task_id: False)
    ds = QueuedBehindSlow(N, BS)
    loader = _loader(ds, persistent_workers=True)
    first = list(loader)
    assert _indices(first) == EXPECTED
    assert ds.reloaded.wait(BLOCK_S)  # worker 0 loaded its copy of batch 4 after batch 2
    assert ds.loads[EXPECTED[4]].tolist() == [2] * BS
    for epoch in range(2):  # the stale copy's reply is dropped, its slab reused
        ds.rearm()
        again = list(loader)
        assert _indices(again) == EXPECTED, epoch  # which worker loads what may differ


# -- the worker's side of the protocol, driven through a real worker's socket -----------------


def test_worker_gives_back_queued_tasks_and_ignores_late_cancels():
    ds = Gated(gated=(0,))
    main = PlayedMain(ds)
    try:
        main.send(msg.Task(0, 0, [0], []))
        assert ds.started.wait(BLOCK_S)  # task 0 runs, held at the gate
        main.send(msg.Task(0, 1, [1], []))
        main.send(msg.Task(0, 2, [2], []))
        main.send(msg.Cancel(0, 0))  # too late: started
        main.send(msg.Cancel(0, 2))  # read ahead while task 1 starts: withdrawn
        main.send(msg.Cancel(0, 1))  # queued: withdrawn before it starts
        main.send(msg.Cancel(5, 3))  # another epoch's task it never got: ignored
        ds.gate.set()
        # In any order: the worker also reads ahead before it creates its first slab.
        answers = {tag_and_task(main.reply()) for _ in range(3)}
        assert answers == {(msg.Tag.DONE, 0), (msg.Tag.CANCELLED, 1), (msg.Tag.CANCELLED, 2)}
        main.send(msg.Task(0, 3, [3], []))
        assert tag_and_task(main.reply()) == (msg.Tag.DONE, 3)  # nothing else was pending
    finally:
        main.stop()
