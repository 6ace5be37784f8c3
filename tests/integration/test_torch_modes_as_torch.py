"""The program's torch modes and its profiler see torch's calls under stoker's loader (NOTE
[ The program's torch modes see torch's calls ] in ``stoker/_core/torch_modes.py``). Each case
runs the same program under torch's DataLoader and stoker's in fresh interpreters and compares
what a logging ``TorchFunctionMode`` (on the main thread, and in workers forked while it was
active) and a ``TorchDispatchMode`` saw, and the loader's ranges in a ``torch.profiler`` trace.
Each failed before the NOTE: stoker's statistics, RNG copies, sampler fast path, transport
and pickling were seen (``size``, ``numpy``, ``zeros``...), and torch's
``enumerate(DataLoader)#...__next__`` range was missing (a trace showed ``stoker: next()``).
"""

from __future__ import annotations

import json

import pytest
from _probe_run import run_probe


def _probe(loader: str, kind: str, num_workers: int, order: str, out) -> dict:
    out.mkdir()
    proc = run_probe(loader, "_modes_probe.py", kind, str(num_workers), order, str(out))
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize(("kind", "num_workers", "order"), [
    ("plain", 0, "ordered"), ("plain", 2, "shuffle"), ("tensor", 0, "shuffle"),
    ("tensor", 2, "ordered"),
])
def test_modes_and_the_profiler_see_torchs_calls(kind, num_workers, order, tmp_path,
                                                  stoker_only):
    torchs = _probe("torch", kind, num_workers, order, tmp_path / "torch")
    stokers = _probe("stoker", kind, num_workers, order, tmp_path / "stoker")
    assert stokers == torchs
    # what the comparison covers, as torch gives it
    it = "_SingleProcessDataLoaderIter" if num_workers == 0 else "_MultiProcessingDataLoaderIter"
    assert torchs["ranges"] == {f"enumerate(DataLoader)#{it}.__next__": 9}  # 8 and the end
    assert torchs["calls"]["TensorBase.item"] >= 1  # the base seed's draw, at least
    assert torchs["ops"]["aten.random_.default"] >= 1
    if kind == "plain" and num_workers:
        assert sorted(torchs["workers"]) == ["worker0.json", "worker1.json"]
        assert torchs["workers"]["worker0.json"]["_VariableFunctionsClass.stack"] >= 1
