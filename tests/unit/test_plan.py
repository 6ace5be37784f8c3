"""``loader.plan()``: one frozen plan per pass, decided from the arguments as they are when it
is made (NOTE [ One plan ] in ``stoker._core.plan``). No processes here: plans are made, not run
(except at num_workers=0)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import stoker
from stoker._core.plan import Plan

DOCS = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"


def _dataset() -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))


def test_the_default_plan_is_torchs() -> None:
    plan = stoker.DataLoader(_dataset(), batch_size=4, num_workers=2).plan()
    assert isinstance(plan, Plan)
    assert plan.executor == "processes" and plan.num_workers == 2
    assert plan.seeding == "per_worker" and plan.beyond == frozenset()
    assert plan.prefetch_factor == 2 and not plan.main_rngs
    decided = {d.name: d.value for d in plan.decisions}
    assert decided["transport"] == "torch's" and decided["beyond_torch"] == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_workers = 3  # type: ignore[misc]


def test_the_switch_shows_in_the_plan() -> None:
    plan = stoker.DataLoader(_dataset(), batch_size=4, num_workers=2,
                             beyond_torch={"slab_transport", "per_batch_seeding"}).plan()
    assert plan.seeding == "per_batch" and "slab_transport" in plan.beyond
    assert {d.name: d.value for d in plan.decisions}["transport"] == "slabs"


def test_keep_slabs_implies_slabs_and_the_plan_says_so() -> None:
    plan = stoker.DataLoader(_dataset(), batch_size=4, num_workers=2,
                             beyond_torch={"keep_slabs"}).plan()
    assert "slab_transport" in plan.beyond and "implied by device= / keep_slabs" in str(plan)


def test_arguments_set_after_construction_count_from_the_next_plan() -> None:
    loader = stoker.DataLoader(_dataset(), batch_size=4, num_workers=2,
                               beyond_torch={"inline_gathers"})
    assert loader.plan().executor == "calling_thread"  # plain gathers: no workers needed
    loader.worker_init_fn = print  # torch runs it in every worker: workers it is
    plan = loader.plan()
    assert plan.executor == "processes" and "worker_init_fn" in str(plan)
    loader.num_workers = 0
    assert loader.plan().executor == "calling_thread" and loader.plan().main_rngs


def test_each_pass_runs_the_plan_made_at_its_iter() -> None:
    loader = stoker.DataLoader(_dataset(), batch_size=4)
    assert len(list(loader)) == 8
    loader.collate_fn = lambda samples: len(samples)  # torch reads it at each iter()
    assert list(loader) == [4] * 8 and loader.plan().collate_fn is loader.collate_fn


def test_the_docs_show_the_plan_as_it_prints() -> None:
    text = DOCS.read_text()
    shown = re.search(r"prints:\n\n```text\n(.*?)```", text, re.S)
    assert shown is not None, "docs/doctor.md lost its example of print(loader.plan())"
    dataset = torch.utils.data.TensorDataset(torch.randn(512, 32))
    plan = stoker.DataLoader(dataset, batch_size=64, num_workers=2).plan()
    assert shown.group(1) == str(plan) + "\n"
