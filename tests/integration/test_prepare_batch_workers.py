"""``stoker_prepare_batch`` through real worker processes: every batch is shown to the dataset
before any of its samples is read, whichever way the worker reads them (the concurrency
tuner's first batches go sample by sample, not through a whole-batch fetch), and the
samples are the same as torch's DataLoader gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _datasets import PreparingDataset
from torch.utils.data import DataLoader as TorchDataLoader

import stoker


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_batch_is_shown_before_its_samples_are_read(tmp_path: Path, num_workers) -> None:
    (tmp_path / "torch").mkdir()
    args = {"batch_size": 8, "shuffle": True, "num_workers": num_workers,
            "timeout": 60 if num_workers else 0}
    loader = stoker.DataLoader(PreparingDataset(96, str(tmp_path)),
                               generator=torch.Generator().manual_seed(3), **args)
    got = [b.tolist() for b in loader]
    want = [b.tolist() for b in TorchDataLoader(
        PreparingDataset(96, str(tmp_path / "torch")), generator=torch.Generator().manual_seed(3),
        **args)]
    assert got == want
    shown = 0
    for log in tmp_path.iterdir():
        if log.is_dir():
            continue
        prepared: set[int] = set()
        for kind, value in map(json.loads, log.read_text().splitlines()):
            if kind == "prepare":
                prepared.update(value)
                shown += 1
            else:
                assert value in prepared, f"sample {value} read before its batch was shown"
    assert shown >= len(got)
