"""The main process's copy of torch's dataset classes and its gathers (NOTE [ Gathers read the
workers' starting copy ], ``stoker.engine.main_gathers``), without processes: the copy is
what a worker starting now would hold, the gathers are ``gather``'s, and the segments they
write are reused only when nothing holds them."""

from __future__ import annotations

import mmap
import weakref
from typing import Any

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import ConcatDataset, StackDataset, Subset, TensorDataset, default_collate
from torch.utils.data._utils import collate as torch_collate

from stoker._core.specs import FetchSpec
from stoker.engine import main_gathers
from stoker.engine.fork_private_memory import PrivateMemory
from stoker.engine.main_gathers import MainGathers, snapshot
from stoker.fastpaths.batched_columns import Decline
from stoker.fastpaths.torch_gather import gather
from stoker.transport.reused_shm import MainOwnedSegments


def _spec(dataset: object) -> FetchSpec:
    return FetchSpec(dataset=dataset, kind="map", auto_collation=True,
                     collate_fn=default_collate, drop_last=False)


def test_the_copy_does_not_see_later_changes_and_keeps_aliases_and_container_types():
    x = torch.arange(12.0).reshape(6, 2)
    y = torch.arange(6)
    ds = TensorDataset(x, y)
    tree = ConcatDataset([Subset(ds, [5, 4, 3]), ds])
    copy = snapshot(tree)
    x.mul_(-1)
    y.numpy()[:] += 100  # no version bump: the copy is bytes, not a view
    tree.datasets[0].indices.append(0)
    a, b = copy.datasets
    assert type(copy) is ConcatDataset and type(copy.datasets) is list
    assert a.indices == [5, 4, 3] and type(a.dataset) is TensorDataset
    assert a.dataset is b  # one node twice stays one copy
    assert type(b.tensors) is tuple and len(b.tensors) == 2
    assert torch.equal(b.tensors[0], torch.arange(12.0).reshape(6, 2))
    assert torch.equal(b.tensors[1], torch.arange(6))
    assert copy.cumulative_sizes == [3, 9] and copy.cumulative_sizes is not tree.cumulative_sizes


def test_containers_the_gather_declines_on_stay_as_they_are():
    # a list of datasets in a StackDataset is not torch's form: the gather declines on the
    # copy as the worker's does on its own, so the copy must not turn it into a tuple
    ds = StackDataset(TensorDataset(torch.zeros(3, 2)), TensorDataset(torch.ones(3)))
    ds.datasets = list(ds.datasets)
    copy = snapshot(ds)
    assert type(copy.datasets) is list
    with pytest.raises(Decline):
        gather(copy, [0, 1])
    with pytest.raises(Decline):
        gather(ds, [0, 1])


@pytest.mark.parametrize("make", [
    lambda: [1, 2, 3],  # not torch's classes
    lambda: TensorDataset(torch.zeros(4, 2, requires_grad=True)),
    lambda: TensorDataset(torch.zeros(4, 2).t()),  # not contiguous
    lambda: TensorDataset(torch.zeros(4, 2, dtype=torch.complex64).conj()),
])
def test_no_copy_of_what_the_gather_would_not_read(make):
    assert snapshot(make()) is None


def test_no_copy_past_the_limit():
    ds = TensorDataset(torch.zeros(64, 4), torch.zeros(64))
    assert snapshot(ds, limit=64 * 5 * 4) is not None
    assert snapshot(ds, limit=64 * 5 * 4 - 1) is None


def test_a_loader_that_does_not_qualify_gets_no_copy():
    ds = TensorDataset(torch.zeros(8, 2))
    assert MainGathers.for_loader(_spec(ds), None, False, "fork") is not None
    assert MainGathers.for_loader(_spec(ds), print, False, "fork") is None  # worker_init_fn
    assert MainGathers.for_loader(_spec(ds), None, True, "fork") is None  # fetch_for_batch
    assert MainGathers.for_loader(
        FetchSpec(dataset=ds, kind="map", auto_collation=True, collate_fn=lambda b: b,
                  drop_last=False), None, False, "fork") is None
    # other start methods pickle the dataset, moving its tensors into shared memory
    assert MainGathers.for_loader(_spec(ds), None, False, "spawn") is None
    assert MainGathers.for_loader(_spec(ds), None, False, "forkserver") is None
    with torch.device("cpu"):  # a mode now is the forked workers' mode for their lives
        assert MainGathers.for_loader(_spec(ds), None, False, "fork") is None
    # the collate map as the workers fork is theirs for their lives: the gathers never read it
    tensor_fn = torch_collate.default_collate_fn_map[torch.Tensor]
    torch_collate.default_collate_fn_map[torch.Tensor] = lambda b, **kw: tensor_fn(b, **kw)
    try:
        assert MainGathers.for_loader(_spec(ds), None, False, "fork") is None
    finally:
        torch_collate.default_collate_fn_map[torch.Tensor] = tensor_fn
    # and so is torch.stack (any function torch's path calls) as the program has it then
    stack = torch.stack
    torch.stack = lambda *args, **kwargs: stack(*args, **kwargs)
    try:
        assert MainGathers.for_loader(_spec(ds), None, False, "fork") is None
    finally:
        torch.stack = stack
    assert MainGathers.for_loader(_spec(ds), None, False, "fork") is not None


def _in_shared_memory() -> torch.Tensor:
    return torch.zeros(8, 2).share_memory_()


def _in_a_shared_mapping() -> torch.Tensor:
    return torch.frombuffer(mmap.mmap(-1, 64), dtype=torch.float32).view(8, 2)


def _in_a_file(tmp_path: Any, mode: str) -> torch.Tensor:
    path = tmp_path / "rows.bin"
    numpy.zeros((8, 2), numpy.float32).tofile(path)
    return torch.from_numpy(numpy.memmap(path, mode=mode, dtype=numpy.float32, shape=(8, 2)))


@pytest.mark.parametrize("make", [
    lambda tmp: _in_shared_memory(),
    lambda tmp: _in_a_shared_mapping(),
    lambda tmp: _in_a_file(tmp, "r+"),
    lambda tmp: _in_a_file(tmp, "c"),  # private, but it shows the file's later changes
], ids=["share_memory_", "mmap", "memmap", "memmap-copy-on-write"])
def test_no_copy_of_memory_the_workers_would_share(make, tmp_path):
    # NOTE [ Memory a fork copies ]: torch's forked workers see what is written there later
    x = make(tmp_path)
    assert snapshot(TensorDataset(x, torch.arange(8))) is None
    assert snapshot(TensorDataset(x.clone(), torch.arange(8))) is not None


def test_private_memory_is_told_from_the_rest():
    private = torch.zeros(1 << 20)  # a mapping of its own
    small = torch.zeros(3)  # the heap
    memory = PrivateMemory()
    assert memory.holds(private.data_ptr(), private.nbytes)
    assert memory.holds(small.data_ptr(), small.nbytes)
    assert memory.holds(0, 0)  # nothing to see
    assert not memory.holds(private.data_ptr(), 1 << 62)  # runs past the mappings
    assert not memory.holds(0, 8)  # nothing is mapped there
    shared = _in_shared_memory()
    assert not PrivateMemory().holds(shared.data_ptr(), shared.nbytes)


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and torch.equal(a, b))
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(_same, a, b))
    return False


_INDICES = st.lists(st.one_of(st.integers(-3, 12), st.booleans()), min_size=0, max_size=12)


@settings(max_examples=200, deadline=None, database=None)
@given(indices=_INDICES, bare=st.booleans(), shape=st.sampled_from([(10,), (10, 3), (10, 0)]))
def test_the_rows_path_gives_gathers_batch_or_declines_where_it_does(indices, bare, shape):
    # ``_Rows`` skips the walk over the copy (its nodes cannot change), not the batch's checks
    x = torch.arange(10 * (shape[1] if len(shape) > 1 else 1), dtype=torch.float32).reshape(
        shape)
    ds = x if bare else TensorDataset(x, torch.arange(10) * 3)
    gathers = MainGathers.for_loader(_spec(ds), None, False, "fork")
    assert gathers is not None and gathers._rows is not None
    try:
        expected = gather(ds, indices)
    except Decline:
        expected = None
    try:
        got = gathers.batch(indices)
    except Decline:
        got = None
    if expected is None or got is None:
        # zero-byte outputs decline here (the worker makes torch's empty segment)
        assert got is None and (expected is None or x.numel() == 0 or not indices)
        return
    assert _same(expected, got)
    for t in (got if isinstance(got, list) else [got]):
        assert t.is_shared() and not t.untyped_storage().resizable() and not t.requires_grad
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes


def test_trees_other_than_a_tensor_dataset_use_gather_itself():
    ds = ConcatDataset([TensorDataset(torch.arange(4.0)), TensorDataset(torch.arange(4.0) + 4)])
    gathers = MainGathers.for_loader(_spec(ds), None, False, "fork")
    assert gathers is not None and gathers._rows is None
    got = gathers.batch([0, 5, 7])
    assert _same(got, gather(ds, [0, 5, 7])) and got[0].is_shared()


def test_a_mode_active_in_the_main_process_declines():
    gathers = MainGathers.for_loader(_spec(TensorDataset(torch.zeros(4, 2))), None, False, "fork")
    with torch.device("meta"), pytest.raises(Decline):
        gathers.batch([0, 1])


def test_a_segment_is_written_again_only_once_nothing_holds_it():
    segments = MainOwnedSegments()
    a = segments.empty((4, 2), torch.float32)
    ptr = a.data_ptr()
    others = [segments.empty((4, 2), torch.float32)]  # each kept: only a's may come back
    assert others[0].data_ptr() != ptr  # a holds its segment
    kept = a.untyped_storage()
    del a
    others.append(segments.empty((4, 2), torch.float32))
    assert others[-1].data_ptr() != ptr  # its storage is held
    ref = weakref.ref(kept)
    del kept
    others.append(segments.empty((4, 2), torch.float32))
    assert others[-1].data_ptr() != ptr  # a weak reference could still reach it
    del ref
    assert segments.empty((4, 2), torch.float32).data_ptr() == ptr  # nothing holds it: reused
    assert len({t.data_ptr() for t in others}) == 3
    with pytest.raises(ValueError):
        segments.empty((0, 2), torch.float32)


def test_an_epochs_end_forgets_the_free_segments():
    segments = MainOwnedSegments()
    held = segments.empty((8,), torch.int64)
    segments.empty((8,), torch.int64)  # dropped at once
    segments.end_epoch()
    assert segments._free == {} and list(segments._nbytes) == [0]
    assert held.is_shared()


def test_the_copy_limit_is_a_share_of_available_memory(monkeypatch):
    monkeypatch.setattr(main_gathers, "_available_bytes", lambda: 8 * 64 * 4 * 8)
    ds = TensorDataset(torch.zeros(64, 8))  # 2 KiB, an eighth of "available" exactly
    assert snapshot(ds) is not None
    monkeypatch.setattr(main_gathers, "_available_bytes", lambda: 8 * 64 * 4 * 8 - 8)
    assert snapshot(ds) is None
