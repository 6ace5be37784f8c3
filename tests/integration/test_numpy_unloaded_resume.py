"""A pass does not load ``numpy.random`` in the main process, as torch's does not
(NOTE [ numpy's RNG loads when the program loads it ]); a program that loads it only during
the epoch (its sampler and dataset draw from numpy's global RNG) still resumes exactly in a
fresh process: the epoch's start state holds numpy's state as it loaded."""

from __future__ import annotations

import json

import pytest
from _probe_run import run_probe


@pytest.mark.parametrize("batches", [0, 1, 3])
def test_resumes_the_epoch_numpy_loaded_in(batches, tmp_path):
    saved = tmp_path / "saved.json"
    run_probe("stoker", "_numpy_unloaded_probe.py", "save", str(batches), str(saved))
    out = json.loads(run_probe("stoker", "_numpy_unloaded_probe.py", "resume",
                               str(saved)).stdout.splitlines()[-1])
    assert len(out["expected"]) == 6 - batches
    assert out["rest"] == out["expected"]
