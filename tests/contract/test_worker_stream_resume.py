"""Resume under torch's seeding (``seeding="per_worker"``): each worker continues its own
streams (NOTE [ Worker streams resume ] in ``stoker.engine.worker_streams``).

Each worker is seeded once (base seed + worker id) and then draws from the global RNGs batch
after batch, so a batch's augmentations depend on what its worker drew before. A resume must
give every worker back the RNG states it had after its last delivered batch (map-style), or at
the start of the epoch it re-reads (iterable), after ``worker_init_fn`` ran as it does at every
start; and every batch must go to the worker that loaded it in the uninterrupted run. The
datasets here draw from ``random``, numpy's global RNG and torch's in ``__getitem__`` /
``__iter__``, and their ``worker_init_fn`` draws too. Every test names ``seeding="per_worker"``.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import stoker
from stoker.distributed import shard_iterable
from stoker.engine import cursor
from stoker.testing import assert_resumes_exactly, same_batches

N = 13


def _draws(i: int) -> dict[str, Any]:
    info = get_worker_info()
    return {"index": i, "worker": -1 if info is None else info.id, "py": random.random(),
            "np": np.random.rand(), "torch": torch.rand(2)}


class Augmented(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _draws(i)


class AugmentedStream(IterableDataset):
    """Shards itself across workers; draws in ``__iter__`` too (a per-epoch shuffle)."""

    def __iter__(self) -> Any:
        offset = random.randrange(1000)
        for i in shard_iterable(range(N)):
            yield {**_draws(i), "offset": offset}


def draw_at_start(worker_id: int) -> None:
    """A worker_init_fn that draws (moves every stream of the worker)."""
    random.random()
    np.random.rand(worker_id + 1)
    torch.rand(3)


def build(num_workers: int = 2, *, dataset: Any = None, **kwargs: Any) -> stoker.DataLoader:
    kwargs.setdefault("worker_init_fn", draw_at_start)
    return stoker.DataLoader(
        Augmented() if dataset is None else dataset, num_workers=num_workers,
        generator=torch.Generator().manual_seed(3), seeding="per_worker", timeout=60, **kwargs,
    )


def loaders(**kwargs: Any) -> Any:
    return functools.partial(build, **kwargs)


# -- map-style -------------------------------------------------------------------------------

@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_map_style_resumes_each_workers_streams(persistent: bool) -> None:
    assert_resumes_exactly(
        loaders(shuffle=True, batch_size=3, persistent_workers=persistent),
        epochs=3 if persistent else 2, steps=6,
    )


def test_map_style_three_workers_without_worker_init_fn() -> None:
    # 5 batches per epoch over 3 workers: the resumed epoch's first batch is not worker 0's.
    assert_resumes_exactly(
        loaders(num_workers=3, shuffle=True, batch_size=3, worker_init_fn=None),
        steps=[1, 2, 4, 7],
    )


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_torchs_own_classes_gathered_resume_exactly(persistent: bool) -> None:
    # Gathered batches of torch's classes (NOTE [ torch's own datasets ]) draw nothing, so
    # their replies carry no states: the resumed workers start from their seeded states,
    # which are still the states after every batch.
    tensors = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.arange(40))
    assert_resumes_exactly(
        loaders(dataset=tensors, shuffle=True, batch_size=3, worker_init_fn=None,
                persistent_workers=persistent),
        epochs=2, steps=[1, 5, 9],
    )


def _worker_streams(batches: Sequence[Any]) -> dict[int, list[Any]]:
    """Each worker's draws in the order it made them (a worker's batches arrive in order)."""
    streams: dict[int, list[Any]] = {}
    for batch in batches:
        for k, worker in enumerate(batch["worker"].tolist()):
            streams.setdefault(worker, []).append(
                (batch["py"][k].item(), batch["np"][k].item(), batch["torch"][k].tolist()))
    return streams


def same_worker_streams(expected: Sequence[Any], got: Sequence[Any]) -> None:
    """``in_order=False``: which worker loads which batch depends on timing (torch assigns a
    task to a worker with room), so batches differ run to run; what a resume must keep is that
    every sample is read once and every worker's draws continue its one stream (one of the two
    runs' draws of a worker is a prefix of the other's)."""
    indices = sorted(i for b in got for i in b["index"].tolist())
    assert indices == sorted(i for b in expected for i in b["index"].tolist())
    want, have = _worker_streams(expected), _worker_streams(got)
    for worker in set(want) | set(have):
        a, b = want.get(worker, []), have.get(worker, [])
        shorter = min(len(a), len(b))
        assert a[:shorter] == b[:shorter], f"worker {worker}'s stream does not continue"


def test_out_of_order_delivery_continues_each_workers_stream() -> None:
    assert_resumes_exactly(
        loaders(shuffle=True, batch_size=2, in_order=False), steps=None,
        compare=same_worker_streams,
    )


def _after_a_break(loader: Any, save_after: int | None) -> tuple[list[Any], Any]:
    """Epoch 0 abandoned after one batch (its queued tasks still run in the persistent
    workers), then epoch 1 and 2; the state after ``save_after`` batches of epoch 1."""
    next(iter(loader))
    it = iter(loader)
    state = loader.state_dict() if save_after == 0 else None
    out = []
    for k, batch in enumerate(it, 1):
        out.append(batch)
        if k == save_after:
            state = loader.state_dict()
    return out + list(loader), state


@pytest.mark.parametrize("save_after", [0, 1, 4])
def test_persistent_workers_after_an_abandoned_epoch(save_after: int) -> None:
    # Saved right after iter(), the workers' states for epoch 1 are those after every task
    # they held in epoch 0: state_dict() waits for the workers to report them.
    make = loaders(shuffle=True, batch_size=3, persistent_workers=True)
    reference, _ = _after_a_break(make(), None)
    saved_run, state = _after_a_break(make(), save_after)
    same_batches(reference, saved_run)
    again = make()
    again.load_state_dict(state)
    same_batches(reference, saved_run[:save_after] + list(again) + list(again))


# -- IterableDataset -------------------------------------------------------------------------

@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_iterable_resumes_each_workers_streams(
    persistent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())
    with pytest.warns(UserWarning, match="by reading its first"):
        assert_resumes_exactly(
            loaders(dataset=AugmentedStream(), batch_size=3, persistent_workers=persistent),
            epochs=3 if persistent else 2, steps=5,
        )


# -- another num_workers ---------------------------------------------------------------------

def _mid_epoch_state(**kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("seeding", "per_worker")
    loader = stoker.DataLoader(Augmented(), num_workers=2, shuffle=True, batch_size=3,
                               generator=torch.Generator().manual_seed(3), timeout=60, **kwargs)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    return state


def test_another_num_workers_is_refused_naming_the_switch() -> None:
    state = _mid_epoch_state()
    with pytest.raises(ValueError) as info:
        build(num_workers=3, shuffle=True, batch_size=3).load_state_dict(state)
    assert str(info.value) == (
        "load_state_dict: this state was saved with num_workers=2 under torch's per-worker "
        "seeding (seeding=\"per_worker\"): each worker draws its random numbers from its own "
        "streams, seeded once with base_seed + worker_id, so the rest of the epoch depends on "
        "which worker loads which batch and cannot be drawn by num_workers=3. Load it into a "
        "loader with num_workers=2, or save it from a loader built with seeding=\"per_batch\" "
        "(or beyond_torch=True), which seeds every batch from its position: its states resume "
        "at any num_workers."
    )


def reseed(worker_id: int) -> None:
    """The seed_worker recipe of torch's reproducibility notes."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def test_per_batch_seeding_overruled_by_worker_init_fn_is_refused_naming_it() -> None:
    with pytest.warns(UserWarning, match="worker_init_fn seeded the global RNGs"):
        state = _mid_epoch_state(seeding="per_batch", worker_init_fn=reseed)
    assert state["worker_seeding"] == "worker_init_fn"
    with pytest.raises(ValueError) as info:
        build(num_workers=3, shuffle=True, batch_size=3).load_state_dict(state)
    assert str(info.value) == (
        "load_state_dict: this state was saved with num_workers=2, and its worker_init_fn "
        "seeded the global RNGs in each worker (NOTE [ Seeds set in worker_init_fn stay ]): "
        "each worker draws its random numbers from its own streams, so the rest of the epoch "
        "depends on which worker loads which batch and cannot be drawn by num_workers=3. Load "
        "it into a loader with num_workers=2, or drop the seeding from worker_init_fn: "
        "seeding=\"per_batch\" then seeds every batch from its position, and its states resume "
        "at any num_workers."
    )


def test_a_state_with_nothing_delivered_loads_at_any_num_workers() -> None:
    loader = build(shuffle=True, batch_size=3)
    state = loader.state_dict()
    other = build(num_workers=1, shuffle=True, batch_size=3)
    other.load_state_dict(state)
    assert len(list(other)) == 5


# -- the state itself ------------------------------------------------------------------------

def test_the_state_holds_one_rng_string_per_worker() -> None:
    state = _mid_epoch_state()
    assert state["worker_seeding"] == "per_worker"
    rngs = state["worker_rngs"]
    assert isinstance(rngs, list) and len(rngs) == 2
    assert isinstance(rngs[0], str)  # worker 0 delivered the batch
    assert rngs[1] is None  # worker 1 delivered nothing: it starts as a fresh worker would


def test_a_corrupted_rng_state_is_refused() -> None:
    state = _mid_epoch_state()
    state["worker_rngs"][0] = "not base64!"
    with pytest.raises(ValueError, match=re.escape(
        "load_state_dict: state['worker_rngs'][0] is not a worker's RNG state")):
        build(shuffle=True, batch_size=3).load_state_dict(state)


def test_resumed_run_matches_with_a_plain_loop() -> None:
    # The same check by hand: stop after 2 batches, resume in a new loader, compare.
    reference = [b for b in build(shuffle=True, batch_size=2)]
    first = build(shuffle=True, batch_size=2)
    it = iter(first)
    head = [next(it), next(it)]
    state = first.state_dict()
    del it
    again = build(shuffle=True, batch_size=2)
    again.load_state_dict(state)
    same_batches(reference, head + list(again))
