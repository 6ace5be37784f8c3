"""Accelerate under torchrun (2 processes, gloo, CPU): ``accelerator.prepare`` and
``skip_first_batches`` keep stoker's engine (NOTE [ Accelerate keeps stoker ])."""

from __future__ import annotations

from pathlib import Path

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
