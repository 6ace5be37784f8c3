"""Lightning (CPU, 2 processes, gloo) with a stoker loader built before ``fit`` and passed to
``fit(train_dataloaders=...)``: ``ddp_spawn`` pickles it into the ranks (NOTE [ Loader
pickling ]) and rebuilds it with its injected DistributedSampler; ``ddp`` re-runs the script,
constructing it with WORLD_SIZE set and no RANK or process group yet; ``shard=True`` keeps
stoker's sampler (a DistributedSampler, so Lightning injects none)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _launch import need, records, run


@pytest.mark.parametrize(("strategy", "shard", "sampler"), [
    ("ddp_spawn", "0", "DistributedSampler"),
    ("ddp", "1", "ShardedSampler"),
])
def test_fit_on_a_loader_built_before_fit(
    tmp_path: Path, strategy: str, shard: str, sampler: str
) -> None:
    need("lightning")
    run("lightning_run.py", tmp_path, args=(strategy, shard))
    ranks = records(tmp_path)
    places = [(r["rank"], r["world"], r["backend"]) for r in ranks]
    assert places == [(0, 2, "gloo"), (1, 2, "gloo")]
    for r in ranks:
        assert (r["loader"], r["sampler"], r["batches"]) == ("DataLoader", sampler, 4)
        assert r["engine"] == [1] * 8  # every sample fetched by a stoker worker
    assert sorted(i for r in ranks for i in r["seen"]) == list(range(16))  # each sample once


def test_fit_on_a_loader_built_in_the_hook_that_first_imports_stoker(tmp_path: Path) -> None:
    """Lightning wraps the ``__init__`` of the DataLoader classes defined when it calls
    ``train_dataloader``; with ``import stoker`` inside the hook only torch's records the
    arguments, as stoker passes them, and Lightning rebuilds the loader from that record with
    its DistributedSampler (stoker passed them positionally: "got multiple values for argument
    'sampler'")."""
    need("lightning")
    run("lightning_hook_run.py", tmp_path)
    ranks = records(tmp_path)
    assert [(r["rank"], r["world"], r["first_import"]) for r in ranks] == [
        (0, 2, True), (1, 2, True)
    ]
    for r in ranks:
        assert (r["loader"], r["sampler"], r["batches"]) == (
            "stoker.loader.DataLoader", "DistributedSampler", 4
        )
        assert r["engine"] == [1] * 8  # every sample fetched by a stoker worker
    assert sorted(i for r in ranks for i in r["seen"]) == list(range(16))  # each sample once
