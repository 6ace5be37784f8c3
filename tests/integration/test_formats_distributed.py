"""Every record-format reader under a real process group: 3 gloo ranks x 2 forked workers
each, ``stoker.DataLoader(shard=True, shard_even="exact")`` with a collective in every step.
Together the ranks read each sample of the dataset exactly once, every rank takes the same
number of steps, and the second epoch is a different shuffle. Results travel back as JSON
files; the assertions run here, in the parent (the launcher of test_distributed.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _format_files import READERS, N, expected, readers, tensor_reader, write_all
from test_distributed import (
    COLLECTIVE_TIMEOUT_S,
    LAUNCH_CAP_S,
    LAUNCHER_SLACK_S,
    _free_port,
    mark,
    run_ranks,
)

import stoker

WORLD = 3
# The ranks fixture's launch runs in the first test's setup (its hang detection: run_ranks).
pytestmark = pytest.mark.timeout(LAUNCH_CAP_S + LAUNCHER_SLACK_S + 60)


def _read(name: str, root: str) -> dict[str, Any]:
    dataset = tensor_reader(readers(root), name)
    loader = stoker.DataLoader(
        dataset, batch_size=2, shuffle=True, shard=True, shard_even="exact", num_workers=2,
        generator=torch.Generator().manual_seed(3), timeout=COLLECTIVE_TIMEOUT_S,
        persistent_workers=True,
    )
    epochs = []
    for _ in range(2):
        rows: list[list[int]] = []
        steps = 0
        for batch in loader:
            real = [] if isinstance(batch, stoker.EndOfData) else batch.tolist()
            dist.all_reduce(torch.tensor([1]))  # would time out if a rank stopped early
            rows += real
            steps += 1
            mark(f"{type(dataset).__name__} step {steps}")
        epochs.append({"rows": rows, "steps": steps})
    return {"epochs": epochs}


def _rank_main(rank: int, world: int, port: int, root: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        result = {name: _read(name, root) for name in READERS}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("formats")
    write_all(str(root))
    out = root / "out"
    out.mkdir()
    run_ranks(_rank_main, (WORLD, _free_port(), str(root), str(out)), WORLD)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("name", READERS)
def test_ranks_read_every_sample_once_in_equal_steps(ranks: list[dict[str, Any]],
                                                     name: str) -> None:
    orders = []
    for epoch in range(2):
        per_rank = [r[name]["epochs"][epoch] for r in ranks]
        assert len({r["steps"] for r in per_rank}) == 1, [r["steps"] for r in per_rank]
        rows = [row for r in per_rank for row in r["rows"]]
        assert len(rows) == N, "a sample was lost or read twice"
        assert sorted(rows) == sorted(expected(name))
        assert all(r["rows"] for r in per_rank), "a rank read nothing"
        orders.append([row[0] for r in per_rank for row in r["rows"]])
    assert orders[0] != orders[1], "epoch 1 repeated epoch 0's order"
