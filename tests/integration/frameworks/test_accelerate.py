"""Accelerate under torchrun (2 processes, gloo, CPU): ``accelerator.prepare`` and
``skip_first_batches`` keep stoker's engine (NOTE [ Accelerate keeps stoker ])."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("cls", ["DataLoader", "StatefulDataLoader"])
def test_stateful_save_state_load_state_resumes_every_rank_exactly(
    tmp_path: Path, cls: str
) -> None:
    """``use_stateful_dataloader=True``: Accelerate adds ``_iterator_finished`` to the loader's
    state and has every rank write one shared file; each rank still resumes with its own seeds
    (NOTE [ Every rank's part ]), and nothing is said (it was refused as a mix of ranks)."""
    need("accelerate", "torchdata")
    run("accelerate_resume_run.py", tmp_path, nproc=2, args=("save", cls))
    run("accelerate_resume_run.py", tmp_path, nproc=2, args=("load", cls))
    saved = [json.loads((tmp_path / f"save_rank{r}.json").read_text()) for r in (0, 1)]
    loaded = [json.loads((tmp_path / f"load_rank{r}.json").read_text()) for r in (0, 1)]
    draws = [{d for b in s["batches"] for _, d in b} for s in saved]
    assert not draws[0] & draws[1]  # the ranks drew apart: another rank's seeds would show
    for rank in (0, 1):
        assert saved[rank]["base"] == loaded[rank]["base"] == "DataLoader"
        assert len(saved[rank]["batches"]) == 6
        assert loaded[rank]["batches"] == saved[rank]["batches"][3:], rank
        assert saved[rank]["warned"] == loaded[rank]["warned"] == []


def test_stateful_save_state_on_the_main_process_alone(tmp_path: Path) -> None:
    """``save_state()`` called on the main process alone (Accelerate allows it under DDP): no
    collective waits for the other rank; rank 0 resumes exactly, and rank 1, which saved
    nothing of its own, is told that it goes on with rank 0's state and what to do."""
    need("accelerate", "torchdata")
    run("accelerate_resume_run.py", tmp_path, nproc=2, args=("save-main", "DataLoader"))
    run("accelerate_resume_run.py", tmp_path, nproc=2, args=("load", "DataLoader"))
    saved = [json.loads((tmp_path / f"save-main_rank{r}.json").read_text()) for r in (0, 1)]
    loaded = [json.loads((tmp_path / f"load_rank{r}.json").read_text()) for r in (0, 1)]
    assert loaded[0]["batches"] == saved[0]["batches"][3:]
    assert loaded[0]["warned"] == []
    assert loaded[1]["warned"] == [
        "load_state_dict: this state was saved by rank 0 of 2 and has no part for this "
        "process, rank 1. A loader's state belongs to the rank that saved it (the base seed and "
        "generator states it drew, its workers' and dataset's progress): loaded here, rank 1 "
        "would go on with rank 0's seeds, which is right only if every rank seeded its loader "
        "alike. Accelerate's save_state writes one loader state for all ranks; stoker keeps "
        "each rank's own beside it (stoker_dl_state_dict_rank<r>.bin) where save_state() runs "
        "on that rank, and this rank has none (save_state() called on the main process alone, "
        "or by an older stoker). Call accelerator.save_state() on every process."
    ]


def test_stateful_epochs_are_torchdatas_epochs(tmp_path: Path) -> None:
    """Under ``use_stateful_dataloader=True`` Accelerate builds torchdata's loader first, and its
    ``state_dict()`` draws the first epoch's base seed; the stoker loader put in its place drew
    it again from where that draw left the generator: its epoch 0 was torchdata's epoch 1 (other
    permutation, other augmentations). Now the same epochs, draws included, but one place:
    torchdata's first iterator, made (and, with workers, prefetching) before Accelerate
    synchronises the ranks' sampler generators, gives rank 1 a permutation of its own in epoch
    0 (the ranks' shards overlap); stoker's draws from the synchronised one, each sample once."""
    need("accelerate", "torchdata")
    for cls in ("torch", "stoker"):
        run("accelerate_resume_run.py", tmp_path, nproc=2, args=("epochs", cls))
    torchdata, ours = ([json.loads((tmp_path / f"{cls}_rank{r}.json").read_text()) for r in (0, 1)]
                       for cls in ("torch", "stoker"))
    for rank in (0, 1):
        assert (torchdata[rank]["base"], ours[rank]["base"]) == ("StatefulDataLoader",
                                                                 "DataLoader")
    assert ours[0]["epochs"] == torchdata[0]["epochs"]
    assert ours[1]["epochs"][1] == torchdata[1]["epochs"][1]
    for epoch in (0, 1):
        ids = sorted(i for r in ours for b in r["epochs"][epoch] for i, _ in b)
        assert ids == list(range(24)), epoch
