"""NOTE [ Accelerate keeps stoker ]: what replaces Accelerate's rebuilt base loader, and the
warning when nothing can (no Accelerate needed: the objects stand in for its wrappers' shape)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

import stoker
from stoker.integrations import accelerate as integration


def _ds() -> TensorDataset:
    return TensorDataset(torch.arange(8))


class Shard:
    """Shaped like Accelerate's DataLoaderShard: a torch loader under ``base_dataloader``."""

    def __init__(self, base: torch.utils.data.DataLoader) -> None:
        self.base_dataloader = base
        self.dl_state_dict = {}


def test_a_rebuilt_torch_base_becomes_a_stoker_loader_with_the_original_arguments() -> None:
    source = stoker.DataLoader(_ds(), batch_size=2, seeding="per_worker", on_error="skip",
                               shard=True, shard_even="drop", collect_stats=True)
    sharded = BatchSampler(SequentialSampler(range(4)), batch_size=2, drop_last=False)
    shard = Shard(torch.utils.data.DataLoader(source.dataset, batch_sampler=sharded))
    assert integration.adopt(source, shard, "prepare") is shard
    base = shard.base_dataloader
    assert type(base) is stoker.DataLoader
    assert (base.seeding, base.on_error, base.shard_even, base.shard) == (
        "per_worker", "skip", "drop", False  # Accelerate's batch sampler already shards
    )
    assert base.batch_sampler is sharded
    assert shard.dl_state_dict == base.state_dict()  # Accelerate's copy of the state
    assert [b[0].tolist() for b in shard.base_dataloader] == [[0, 1], [2, 3]]


def test_every_stoker_argument_is_an_attribute_a_rebuild_can_read() -> None:
    loader = stoker.DataLoader(_ds())
    missing = [n for n in integration.stoker_arguments() if not hasattr(loader, n)]
    assert missing == []


def test_a_wrapper_it_cannot_rebuild_is_reported_once(monkeypatch) -> None:
    monkeypatch.setattr(integration, "_warned", set())
    source = stoker.DataLoader(_ds(), batch_size=2)

    class XlaWrapper:
        pass

    with pytest.warns(RuntimeWarning) as record:
        integration.adopt(source, XlaWrapper(), "accelerate's prepare_data_loader()")
    assert str(record[0].message) == (
        "accelerate's prepare_data_loader() replaced a stoker.DataLoader with Accelerate's "
        "XlaWrapper, which stoker cannot rebuild: batches now come from torch's DataLoader, "
        "without stoker's engine (loader.stats() stays at 0). Iterate the stoker loader "
        "yourself (skip accelerator.prepare for it and move batches with accelerator.device), "
        "or report this Accelerate version to stoker."
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        integration.adopt(source, XlaWrapper(), "accelerate's prepare_data_loader()")


def test_an_adapter_reads_the_loader_being_rebuilt_from_the_stack(monkeypatch) -> None:
    """Not from its dataset: loaders may share one (NOTE [ Accelerate keeps stoker ])."""

    def prepare_data_loader(dataloader: object) -> object:
        return integration._being_rebuilt()

    monkeypatch.setattr(integration, "_rebuilder_codes", {prepare_data_loader.__code__})
    loader = object()
    assert prepare_data_loader(loader) is loader
    assert integration._being_rebuilt() is None
