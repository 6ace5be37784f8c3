"""NOTE [ Engine state ]: what a loader keeps across epochs, and what travels in a pickle."""

from __future__ import annotations

import copy
import pickle

import torch
from torch.utils.data import TensorDataset

import stoker
from stoker.engine.loader_state import EngineState


def test_portable_facts_travel_and_process_local_parts_are_rebuilt():
    dataset = TensorDataset(torch.arange(8))
    state = EngineState(dataset, num_workers=2, collect_stats=True)
    state.inline, state.init_fn_seeds_told = False, True
    state.skip_logged.add("a skip message")
    state.vector_trusted = dataset
    state.stats.batches = 5
    state.progress = object()
    twin = pickle.loads(pickle.dumps(state))
    assert twin.inline is False and twin.init_fn_seeds_told is True
    assert twin.skip_logged == {"a skip message"}
    assert twin.vector_trusted is twin.dataset  # the same dataset object in the copy
    assert twin.progress is None and twin.stats.batches == 0
    assert twin.slab_bank is not state.slab_bank
    assert twin.memory_watch is not None and twin.memory_watch is not state.memory_watch


def test_iterators_write_what_they_learn_into_the_loaders_engine_state():
    loader = stoker.DataLoader(TensorDataset(torch.arange(8)), batch_size=4)
    assert loader._engine.progress is None
    batches = list(loader)
    assert len(batches) == 2
    assert loader._engine.progress is not None and loader._engine.progress.finished
    assert loader.stats().batches == 2
    twin = copy.deepcopy(loader)
    assert twin._engine is not loader._engine and twin.stats().batches == 0
    assert twin._engine.progress is None


def test_advice_stays_with_the_loader_when_its_worker_count_changes():
    """LoaderStats.advice (issue 44): kept across ``fit_workers``, and what the memory watch
    made before the change tells lands in the stats read after it."""
    state = EngineState(TensorDataset(torch.arange(8)), num_workers=2, collect_stats=True)
    assert state.stats.advise("a generator every worker copies")
    assert not state.stats.advise("a generator every worker copies")  # once
    watch = state.memory_watch
    state.fit_workers(3)
    watch._tell("worker memory keeps growing")
    assert state.stats.snapshot().advice == (
        "a generator every worker copies", "worker memory keeps growing")
    off = EngineState(TensorDataset(torch.arange(8)), num_workers=0, collect_stats=False)
    off.stats.advise("said with the stats off")
    assert off.stats.snapshot().advice == ("said with the stats off",)
