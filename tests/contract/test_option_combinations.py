"""stoker's own options in random combinations (the opt-ins beyond torch, ``worker_type``,
``shard``, ``on_error``, ``seeding``, ``collect_stats``) with torch's arguments: every epoch
delivers each sample once (or what ``drop_last`` and a skipped sample leave), a state saved
after the first batch resumes with exactly the rest, and ``stats()`` renders. Not a
comparison with torch (these options are beyond it; the differential fuzzer checks the
defaults): a check that no combination breaks. The three it found are kept in ``FIXED``.

Each configuration comes from a seed (``SEEDS`` in the default run; the failing one is in the
test's id and replays alone). ``-m soak`` runs ``STOKER_COMBO_EXAMPLES`` more (default 400)
from ``STOKER_COMBO_SEED``.
"""

from __future__ import annotations

import os
import random
import warnings
from typing import Any

import pytest
import torch
from _combo_datasets import indices_of, make, stack, wif

import stoker

BEYOND = ["per_batch_seeding", "inline_gathers", "batched_getitem", "deep_prefetch",
          "move_stragglers", "epoch_autopilot", "shared_lists", "slab_transport", "keep_slabs",
          "thread_caps", "gc_freeze", "profiler_ranges", "pickle_once"]
SEEDS = range(24)


def configuration(seed: int) -> tuple[str, int, dict[str, Any]]:
    """(dataset kind, its length, the loader's keyword arguments) drawn from ``seed``; a
    ``generator`` is given as its seed (each loader gets a fresh one)."""
    r = random.Random(seed)
    n = r.choice([7, 16, 33])
    kind = r.choice(["list", "pairs", "rows", "tensors", "records", "stream", "failing"])
    worker_type = r.choice(["auto", "process"] if kind == "stream"
                           else ["auto", "auto", "process", "thread"])
    num_workers = r.choice([0, 1, 2])
    kw: dict[str, Any] = {"batch_size": r.choice([None, 1, 3, 4]), "num_workers": num_workers,
                          "worker_type": worker_type,
                          "shuffle": kind != "stream" and r.random() < 0.5}
    if kw["batch_size"] is not None:
        kw["drop_last"] = r.random() < 0.3
        if kind in ("list", "pairs", "rows", "failing") and r.random() < 0.2:
            kw["collate_fn"] = stack
    if num_workers:
        kw.update(persistent_workers=r.random() < 0.5, prefetch_factor=r.choice([1, 2, 4]),
                  in_order=r.random() < 0.8, timeout=120)
        if r.random() < 0.1:
            kw["multiprocessing_context"] = "spawn"
        if r.random() < 0.2:
            kw["worker_init_fn"] = wif
    if r.random() < 0.2:
        kw["pin_memory"] = True
    roll = r.random()
    if roll < 0.1:
        kw["beyond_torch"] = True
    elif roll < 0.6:
        kw["beyond_torch"] = set(r.sample(BEYOND, r.randint(1, 4)))
    if r.random() < 0.2:
        kw["seeding"] = r.choice(["per_batch", "per_worker"])
    if kind == "failing" or (kind not in ("tensors", "stream") and r.random() < 0.2):
        kw.update(on_error="skip", skip_budget=5)
    if r.random() < 0.2:
        kw["collect_stats"] = False
    if kw["shuffle"] and r.random() < 0.3:
        kw["generator"] = seed
    if kind != "stream" and r.random() < 0.1:
        kw["shard"] = True
    return kind, n, kw


def _loader(dataset: Any, kw: dict[str, Any]) -> Any:
    if "generator" in kw:
        kw = {**kw, "generator": torch.Generator().manual_seed(kw["generator"])}
    return stoker.DataLoader(dataset, **kw)


# The combinations that broke, as found (each failed before its fix).
FIXED = {
    "thread_executor_with_persistent_workers": (
        "list", 7, {"batch_size": 1, "num_workers": 1, "worker_type": "thread",
                    "persistent_workers": True}),
    "inline_gathers_whose_first_probe_disagrees": (
        "pairs", 33, {"batch_size": 4, "num_workers": 1, "beyond_torch": {"inline_gathers"}}),
    "sharded_resume_with_workers_unbatched": (
        "records", 33, {"batch_size": None, "num_workers": 2, "shard": True}),
}


def check(seed: int) -> None:
    check_configuration(*configuration(seed))


def check_configuration(kind: str, n: int, kw: dict[str, Any]) -> None:
    dataset = make(kind, n)
    expected = [i for i in range(n) if not (kind == "failing" and i == 5)]
    exact = kind not in ("stream", "failing") and not kw.get("drop_last")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator: torch's warning
        loader = _loader(dataset, kw)
        for _ in range(2):
            got = sorted(i for batch in loader for i in indices_of(kind, batch))
            if exact:
                assert got == expected
            else:
                assert len(got) == len(set(got)) and set(got) <= set(expected), got
        it = iter(loader)
        first = next(it, None)
        state = loader.state_dict()
        rest = sorted(i for batch in it for i in indices_of(kind, batch))
        resumed = _loader(dataset, kw)
        resumed.load_state_dict(state)
        again = sorted(i for batch in resumed for i in indices_of(kind, batch))
        assert again == rest
        assert not set(again) & set(indices_of(kind, first) if first is not None else [])
        assert str(loader.stats()) and str(resumed.stats())
        del it, loader, resumed


@pytest.mark.parametrize("seed", SEEDS)
def test_a_combination_of_options_loads_every_sample_once_and_resumes(
    seed: int, stoker_only: None
) -> None:
    check(seed)


@pytest.mark.parametrize("name", sorted(FIXED))
def test_a_combination_that_broke_works(name: str, stoker_only: None) -> None:
    check_configuration(*FIXED[name])


@pytest.mark.soak
@pytest.mark.slow
def test_combinations_of_options_soak(stoker_only: None) -> None:
    start = int(os.environ.get("STOKER_COMBO_SEED", "1000"))
    count = int(os.environ.get("STOKER_COMBO_EXAMPLES", "400"))
    for seed in range(start, start + count):
        try:
            check(seed)
        except Exception as exc:
            raise AssertionError(f"configuration {seed}: {configuration(seed)}") from exc
