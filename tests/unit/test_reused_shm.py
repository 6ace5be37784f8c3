"""torch's shared memory, reused (NOTE [ torch's shared memory, reused ]): both sides in one
process, through the real pickling of ``transport.torch_way``: what arrives is torch's, a
segment goes back only when nothing holds it, and never once another process may see it."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.multiprocessing import reductions as torch_reductions
from torch.overrides import TorchFunctionMode
from torch.utils.data import default_collate
from torch.utils.data._utils import worker as torch_worker

from _tensor_layout import tensor_layout
from stoker.transport import reused_shm, torch_way
from stoker.transport.reused_shm import MainSegments, WorkerSegments


@pytest.fixture
def in_a_worker() -> Iterator[None]:
    """``default_collate`` allocates in shared memory, as in a worker."""
    torch_worker._worker_info = torch_worker.WorkerInfo(id=0, num_workers=1, seed=0,
                                                        dataset=None)
    try:
        yield
    finally:
        torch_worker._worker_info = None


def _samples(start: int, n: int = 8) -> list[dict[str, Any]]:
    return [{"x": torch.arange(4, dtype=torch.float32) + i, "y": i}
            for i in range(start, start + n)]


class _Link:
    """One worker's side and the main process's, in this process."""

    def __init__(self) -> None:
        self.worker, self.main = WorkerSegments(), MainSegments()
        self.fds_sent: list[int] = []

    def batch(self, samples: list[Any], mode: Any = None) -> Any:
        """``samples`` collated in the worker and rebuilt in the main process (inside
        ``mode``, a ``TorchFunctionMode``, if given)."""
        assert self.worker.start_task()
        try:
            batch = default_collate(samples)
            chosen = self.worker.prepare(batch)
            payload, fds, _ = torch_way.dumps(batch, self.worker, chosen)
            del batch
        finally:
            self.worker.end_task()
        self.fds_sent.append(len(fds))
        with mode if mode is not None else contextlib.nullcontext():
            return torch_way.loads(payload, fds, self.main)

    def give_back(self) -> list[int]:
        ids = self.main.settle()
        self.worker.release(ids)
        return ids


def _torch_way(samples: list[Any], mode: Any = None) -> Any:
    payload, fds, _ = torch_way.dumps(default_collate(samples))
    with mode if mode is not None else contextlib.nullcontext():
        return torch_way.loads(payload, fds)


def _layout(t: torch.Tensor) -> tuple:
    return (*tensor_layout(t), t.tolist())


class _Calls(TorchFunctionMode):
    """The torch functions called while it is active, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        self.names.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


def test_this_torch_counts_references_as_the_checks_read_them():
    assert reused_shm.eligible()


def test_a_batch_arrives_as_torchs_and_its_segments_are_written_again(in_a_worker):
    link = _Link()
    first = link.batch(_samples(0))
    expected = _torch_way(_samples(0))
    assert {k: _layout(v) for k, v in first.items()} == {
        k: _layout(v) for k, v in expected.items()}
    ptrs = {k: v.untyped_storage().data_ptr() for k, v in first.items()}
    assert link.give_back() == []  # the batch is still held
    del first, expected
    assert sorted(link.give_back()) == [0, 1]
    second = link.batch(_samples(8))
    assert link.fds_sent == [2, 0]  # the second batch needed no new shared memory
    assert {k: v.untyped_storage().data_ptr() for k, v in second.items()} == ptrs
    assert second["x"].tolist() == _torch_way(_samples(8))["x"].tolist()
    assert second["y"].tolist() == list(range(8, 16))


def test_a_reused_leaf_is_rebuilt_with_the_calls_torchs_rebuild_makes(in_a_worker):
    # NOTE [ One reduction per reused leaf ]: what a mode sees while the batch is rebuilt,
    # for the first batch (fds) and a later one (segments reused), is what it sees of torch's
    link = _Link()
    for start in (0, 8):
        ours, theirs = _Calls(), _Calls()
        got = link.batch(_samples(start), ours)
        expected = _torch_way(_samples(start), theirs)
        assert ours.names == theirs.names
        assert ours.names.count("empty") == 2  # one rebuild per leaf, seen by the mode
        assert {k: _layout(v) for k, v in got.items()} == {
            k: _layout(v) for k, v in expected.items()}
        del got, expected
        link.give_back()
    assert link.fds_sent == [2, 0]


@pytest.mark.filterwarnings("ignore:Sparse invariant checks", "ignore:Sparse CSR tensor support",
                            "ignore:The PyTorch API of nested tensors")
def test_tensors_without_a_storage_of_their_own_cross_torchs_way_beside_a_reused_leaf(
        in_a_worker):
    # the pickler looks a chosen leaf up by its storage; sparse and nested tensors have none
    link = _Link()
    worker = link.worker
    assert worker.start_task()
    try:
        batch = {"coo": torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,)),
                 "csr": torch.eye(3).to_sparse_csr(),
                 "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
                 "x": default_collate(_samples(0))["x"]}  # pickled after them
        chosen = worker.prepare(batch)
        payload, fds, _ = torch_way.dumps(batch, worker, chosen)
        expected = {k: v.to_dense() if v.layout != torch.strided else v
                    for k, v in batch.items() if k != "nested"}
        del batch
    finally:
        worker.end_task()
    assert len(chosen) == 0  # the one chosen leaf went by its id
    got = torch_way.loads(payload, fds, link.main)
    assert got["coo"].layout == torch.sparse_coo and got["csr"].layout == torch.sparse_csr
    assert got["nested"].is_nested and [t.tolist() for t in got["nested"].unbind()] == [
        [1.0, 1.0], [1.0, 1.0, 1.0]]
    for key, want in expected.items():
        have = got[key]
        assert torch.equal(have.to_dense() if have.layout != torch.strided else have, want)
    assert got["x"].untyped_storage().data_ptr() in {e.ptr for e in link.main._table.values()}


def _hold(x: torch.Tensor, how: str) -> Any:
    if how == "tensor":
        return x
    if how == "view":
        return x[1:, 2]
    if how == "numpy":
        return x.numpy()
    if how == "storage":
        return x.untyped_storage()
    if how == "weak reference to its storage":
        return _Reach(x.untyped_storage())
    return x.storage()


class _Reach:
    """A weak reference to a storage, read as the storage's values while it lives."""

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.ref = weakref.ref(storage)

    def tolist(self) -> list:
        storage = self.ref()
        return [] if storage is None else list(storage.tolist())


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("hold", ["tensor", "view", "numpy", "storage", "typed storage",
                                  "weak reference to its storage"])
def test_a_segment_anything_holds_is_not_given_back(in_a_worker, hold):
    link = _Link()
    batch = link.batch(_samples(0))
    held = _hold(batch["x"], hold)
    del batch
    assert link.give_back() == [1]  # the labels went back, the held images did not
    values = np.asarray(held.tolist() if hasattr(held, "tolist") else list(held))
    for _ in range(3):
        link.batch(_samples(100))
        link.give_back()
    after = np.asarray(held.tolist() if hasattr(held, "tolist") else list(held))
    assert np.array_equal(values, after)


def test_a_batch_held_for_long_is_forgotten_on_both_sides(in_a_worker):
    link = _Link()
    kept = link.batch(_samples(0))
    answers = [link.give_back() for _ in range(reused_shm._MAX_BUSY + 1)]
    assert answers[-1] == [~0, ~1] and not any(answers[:-1])
    assert link.worker._by_ptr == {}  # the worker will not write them again
    link.batch(_samples(8))
    assert link.fds_sent == [2, 2]
    assert kept["x"].tolist() == _torch_way(_samples(0))["x"].tolist()


def test_a_batch_sent_on_to_another_process_is_never_written_again(in_a_worker):
    link = _Link()
    batch = link.batch(_samples(0))
    # what torch.multiprocessing's queues do to a storage they send
    torch_reductions.reduce_storage(batch["x"].untyped_storage())
    del batch
    assert sorted(link.give_back()) == [~0, 1]


def test_a_fork_while_a_batch_is_out_keeps_its_segments(in_a_worker):
    link = _Link()
    batch = link.batch(_samples(0))
    reused_shm._count_fork()  # what os.fork() runs first (no process is started here)
    del batch
    assert sorted(link.give_back()) == [~1, ~0]


def test_a_fork_during_a_task_keeps_what_the_task_handed_out(in_a_worker):
    worker = WorkerSegments()
    assert worker.start_task()
    try:
        loose = default_collate([torch.ones(3), torch.zeros(3)])  # handed out, never sent
        reused_shm._count_fork()
        del loose
    finally:
        worker.end_task()
    assert worker._free == {} and worker._by_ptr == {}


def test_leaves_held_elsewhere_or_aliased_cross_torchs_way(in_a_worker):
    worker = WorkerSegments()
    shared_label = torch.tensor([7, 7])
    assert worker.start_task()
    try:
        batch = {"x": default_collate([torch.ones(2), torch.ones(2)]), "kept": shared_label}
        kept_x = batch["x"]
        twice = torch.tensor([1, 2])
        aliased = [twice, twice]
        assert worker.prepare(batch) == {}
        assert worker.prepare(aliased) == {}
        payload, fds, _ = torch_way.dumps([batch, aliased], worker, {})
        del batch, twice
    finally:
        worker.end_task()
    assert len(fds) == 3  # x, the label, and the aliased tensor once
    assert worker._by_ptr == {}  # x's segment went torch's way: the main process's now
    out_batch, out_aliased = torch_way.loads(payload, fds, MainSegments())
    assert out_aliased[0] is out_aliased[1]
    assert out_batch["x"].tolist() == kept_x.tolist()


def test_what_a_task_handed_out_and_nothing_kept_is_free_again(in_a_worker):
    worker = WorkerSegments()
    assert worker.start_task()
    try:
        default_collate([torch.ones(3), torch.zeros(3)])  # dropped at once
        kept = default_collate([torch.ones(5), torch.zeros(5)])
    finally:
        worker.end_task()
    assert [len(v) for v in worker._free.values()] == [1]
    assert kept.untyped_storage().data_ptr() not in worker._by_ptr


def test_another_sharing_strategy_or_a_replaced_allocator_turns_it_off(monkeypatch):
    monkeypatch.setattr(reused_shm, "get_sharing_strategy", lambda: "file_system")
    assert not reused_shm.eligible()
    assert not WorkerSegments().start_task()
    monkeypatch.setattr(reused_shm, "get_sharing_strategy", lambda: "file_descriptor")
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared",
                        classmethod(lambda cls, size, device="cpu": None), raising=False)
    assert not reused_shm.eligible()


def test_the_self_check_fails_where_references_count_otherwise(monkeypatch):
    monkeypatch.setattr(reused_shm, "_MAIN_FREE", (1, 3))
    assert not reused_shm._check_main_side()
    monkeypatch.setattr(reused_shm, "_SEGMENT_LEAF", (2, 2))
    assert not reused_shm._check_worker_side()


def test_later_batches_open_no_fd_and_received_fds_are_closed(in_a_worker):
    link = _Link()
    before = len(os.listdir("/proc/self/fd"))
    batch = link.batch(_samples(0))
    # two segments, each with the worker's fd and the main storage's own (torch's rebuild
    # dup()s the fd it is given); the fds that crossed are closed
    assert len(os.listdir("/proc/self/fd")) == before + 4
    del batch
    link.give_back()
    for start in (8, 16, 24):
        batch = link.batch(_samples(start))
        del batch
        link.give_back()
    assert len(os.listdir("/proc/self/fd")) == before + 4


def test_free_segments_past_the_cap_are_forgotten_on_both_sides(in_a_worker):
    link = _Link()
    held = [link.batch(_samples(8 * k)) for k in range(reused_shm._MAX_FREE_PER_SIZE + 2)]
    del held
    assert len(link.give_back()) == 2 * (reused_shm._MAX_FREE_PER_SIZE + 2)
    dropped = link.worker.dropped
    assert len(dropped) == 4  # two of each size past the cap
    assert all(i in link.main._table for i in dropped)
    link.main.drop(dropped)  # what the worker's next Done says (its `retired`)
    assert not any(i in link.main._table for i in dropped)
    assert len(link.main._table) == 2 * reused_shm._MAX_FREE_PER_SIZE


def test_at_an_epochs_end_only_what_the_user_holds_keeps_memory(in_a_worker):
    link = _Link()
    kept = link.batch(_samples(0))
    dropped = link.batch(_samples(8))
    del dropped
    link.give_back()
    link.batch(_samples(16))  # reuses the dropped batch's segments, dropped at once
    ids = link.main.end_epoch()
    link.worker.release(ids)
    link.worker.drop_free()  # what Release(epoch_ended=True) does in the worker
    assert sorted(link.main._table) == [0, 1]  # the kept batch's, lent
    assert link.worker._free == {}
    assert {seg.id for seg in link.worker._by_ptr.values()} == {0, 1}
    assert kept["x"].tolist() == _torch_way(_samples(0))["x"].tolist()
