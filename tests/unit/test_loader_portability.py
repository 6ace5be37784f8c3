"""A loader travels like torch's: pickle, deepcopy, built before the process group exists,
rebuilt by a framework with an injected ``DistributedSampler``. No processes here."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

import stoker
from stoker.sampling.sharded import ShardedSampler

N = 12


def _ds() -> TensorDataset:
    return TensorDataset(torch.arange(N))


def _batches(loader) -> list[list[int]]:
    return [b[0].tolist() for b in loader]


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))])
def test_a_loader_copies_and_the_copy_iterates_the_same(copier) -> None:
    loader = stoker.DataLoader(
        _ds(), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3),
        num_workers=2, shard=True, shard_even="exact", beyond_torch={"inline_gathers"},
    )  # plain gathers load inline: no processes in a unit test
    twin = copier(loader)
    assert _batches(twin) == _batches(loader)
    assert twin.stats().batches == 3  # its own engine, counting its own batches
    assert twin._engine.slab_bank is not loader._engine.slab_bank


def test_a_copy_taken_mid_epoch_starts_afresh_and_keeps_a_pending_state() -> None:
    loader = stoker.DataLoader(_ds(), batch_size=5)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    twin = copy.deepcopy(loader)
    assert twin.state_dict()["batches"] == 0  # like torch: the iterator is not copied
    pending = stoker.DataLoader(_ds(), batch_size=5)
    pending.load_state_dict(state)
    assert _batches(copy.deepcopy(pending)) == [[5, 6, 7, 8, 9], [10, 11]]


def test_construction_needs_no_rank_and_reads_it_when_iteration_starts(monkeypatch) -> None:
    # Lightning's ddp sets WORLD_SIZE and LOCAL_RANK before the process group (and RANK) exist.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    loader = stoker.DataLoader(_ds(), batch_size=4, shard=True)
    monkeypatch.setenv("RANK", "1")
    assert loader.dist_context.rank == 1
    assert _batches(loader) == [[1, 3, 5, 7], [9, 11]]
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError) as info:  # when the pass starts: at the first batch
        next(iter(loader))
    assert str(info.value) == (
        "WORLD_SIZE='2' is set but RANK is not: a launcher such as torchrun sets both; set RANK "
        "too, or unset WORLD_SIZE to run as a single process"
    )


def test_the_shard_sampler_is_a_distributed_sampler_frameworks_leave_alone() -> None:
    loader = stoker.DataLoader(_ds(), batch_size=4, shard=True)
    assert isinstance(loader.sampler, ShardedSampler)
    assert isinstance(loader.sampler, DistributedSampler)
    assert (loader.sampler.num_replicas, loader.sampler.rank) == (1, 0)
    assert loader.sampler.num_samples == N


def test_shard_with_an_injected_distributed_sampler_uses_it() -> None:
    injected = DistributedSampler(_ds(), num_replicas=3, rank=2, shuffle=False)
    loader = stoker.DataLoader(_ds(), batch_size=2, shard=True, sampler=injected)
    assert loader.sampler is injected
    assert _batches(loader) == [[2, 5], [8, 11]]
