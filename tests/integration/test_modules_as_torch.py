"""The modules a program finds loaded after a pass (``sys.modules``, in the main process and
in a worker) are torch's, stoker's own aside: found by a blind sweep, stoker loaded
``statistics`` (and ``decimal``, ``fractions``), ``faulthandler``, ``resource`` and
``sysconfig``, and not torch's ``multiprocessing.queues``/``synchronize``; its record of the
global RNGs loaded ``numpy.random`` in the main process (torch's loader loads it only in its
workers, to seed it), its shared memory names ``secrets``, and with workers it did not load
``hmac`` (torch's main process does, as it receives a worker's first storage)."""

from __future__ import annotations

import json

import pytest
from _probe_run import run_probe


def _probe(loader: str, num_workers: int, method: str, out) -> dict:
    out.mkdir()
    proc = run_probe(loader, "_modules_probe.py", str(num_workers), method, str(out))
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize(("num_workers", "method"), [(0, "fork"), (2, "fork"), (2, "spawn")])
def test_a_pass_loads_torchs_modules(num_workers, method, tmp_path, stoker_only):
    torchs = _probe("torch", num_workers, method, tmp_path / "torch")
    stokers = _probe("stoker", num_workers, method, tmp_path / "stoker")
    assert stokers["batches"] == torchs["batches"]
    assert stokers["main"] == torchs["main"]
    if num_workers:
        assert stokers["worker"] == torchs["worker"]
        assert "multiprocessing.queues" in torchs["main"]  # what the comparison covers
