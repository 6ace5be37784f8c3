"""Accelerate under torchrun (2 processes, gloo, CPU): ``accelerator.prepare`` and
``skip_first_batches`` keep stoker's engine (NOTE [ Accelerate keeps stoker ])."""

from __future__ import annotations

from pathlib import Path

import pytest
from _launch import need, records, run


def test_prepare_and_skip_first_batches_keep_stoker_under_torchrun(tmp_path: Path) -> None:
    need("accelerate")
    run("accelerate_run.py", tmp_path, nproc=2)
    ranks = records(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["world"], r["backend"]) == (2, "gloo")
        assert r["base_type"] == "stoker.loader.DataLoader"
        assert r["base_worker_type"] == "thread"  # stoker's own argument survived prepare
        assert r["base_batches"] == 4  # the engine counted what it delivered
        assert r["skip_type"] == "DataLoader" and r["skip_batches"] == 2
        assert len(r["resumed"]) == 2
    # Accelerate's sharding: the ranks' batches are disjoint and cover the data once.
    seen = sorted(i for r in ranks for batch in r["epoch"] for i in batch)
    assert seen == list(range(16))


TORCH_BASE = "torch.utils.data.dataloader.DataLoader"
STOKER_BASE = "stoker.loader.DataLoader"
RAISED = "ValueError: bad sample 3"


@pytest.mark.parametrize("binding", ["accelerator", "bound-before"])
def test_prepare_rebuilds_each_loader_as_what_it_was_when_loaders_share_a_dataset(
    tmp_path: Path, binding: str
) -> None:
    """A torch loader sharing its dataset with a stoker loader stays torch's (it was rebuilt as
    a stoker loader with the other's on_error='skip': the bad sample skipped silently), and
    each stoker loader keeps its own arguments; also through Accelerate's functions bound
    before ``import stoker``."""
    need("accelerate")
    run("accelerate_shared_run.py", tmp_path, args=(binding,))
    (record,) = records(tmp_path)
    # Accelerate reads a batch ahead: the error of batch [2, 3] comes before [0, 1] is yielded.
    torch_way = {"base": TORCH_BASE, "on_error": None, "stall_warning_s": None,
                 "raised": RAISED, "batches": []}
    assert record["torch"] == record["torch, skip 1"] == torch_way
    raising = {"base": STOKER_BASE, "on_error": "raise", "stall_warning_s": 7.0,
               "raised": RAISED, "batches": []}
    assert record["stoker_raise"] == record["stoker_raise, skip 1"] == raising
    skipping = {"base": STOKER_BASE, "on_error": "skip", "stall_warning_s": 300.0,
                "batches": [[0, 1], [2], [4, 5], [6, 7]]}
    assert record["stoker_skip"] == skipping
    assert record["stoker_skip, skip 1"] == {**skipping, "batches": [[2], [4, 5], [6, 7]]}
