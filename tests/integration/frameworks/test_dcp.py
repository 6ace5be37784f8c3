"""``torch.distributed.checkpoint`` across 2 processes (gloo): save a ``shard=True`` loader
mid-epoch, load it into a fresh one, and the epoch continues exactly."""

from __future__ import annotations

from pathlib import Path

from _launch import records, run


def test_dcp_save_mid_epoch_load_into_a_fresh_loader(tmp_path: Path) -> None:
    run("dcp_run.py", tmp_path, nproc=2)
    ranks = records(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert len(r["before"]) == 2
        assert r["before"] + r["after"] == r["reference"]
    assert sorted(i for r in ranks for b in r["reference"] for i in b) == list(range(22))
