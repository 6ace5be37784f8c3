"""Lightning (CPU, 2 processes, gloo): ``seed_everything(7, workers=True)`` (or ``False``), a
mid-epoch ``ModelCheckpoint``, and ``fit(ckpt_path=...)`` in a new process. Lightning writes rank
0's checkpoint and loads it on every rank; each rank still resumes with its own seeds and worker
streams (NOTE [ Every rank's part ]), and stoker says nothing (with ``workers=True`` rank 1 went
on with rank 0's worker streams, and every resume warned on rank 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _launch import DEADLINE_S, need, run


@pytest.mark.timeout(2 * DEADLINE_S + 20)  # two runs of the script
@pytest.mark.parametrize(("strategy", "workers"), [
    ("ddp", "1"), ("ddp_spawn", "1"), ("ddp", "0"),
])
def test_mid_epoch_checkpoint_resumes_every_rank_exactly(
    tmp_path: Path, strategy: str, workers: str
) -> None:
    need("lightning")
    run("lightning_resume_run.py", tmp_path, args=("save", strategy, workers))
    run("lightning_resume_run.py", tmp_path, args=("load", strategy, workers))
    saved = [json.loads((tmp_path / f"save_rank{r}.json").read_text()) for r in (0, 1)]
    loaded = [json.loads((tmp_path / f"load_rank{r}.json").read_text()) for r in (0, 1)]
    draws = [{d for b in s["batches"] for _, d in b} for s in saved]
    if workers == "1":
        assert not draws[0] & draws[1]  # the ranks' workers drew apart
    assert sorted(i for s in saved for b in s["batches"] for i, _ in b) == list(range(24))
    for rank in (0, 1):
        assert saved[rank]["sampler"] == loaded[rank]["sampler"] == "DistributedSampler"
        assert len(saved[rank]["batches"]) == 6
        assert loaded[rank]["batches"] == saved[rank]["batches"][3:], rank
        assert saved[rank]["told"] == loaded[rank]["told"] == [], rank
