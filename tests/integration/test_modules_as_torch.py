"""The modules a program finds loaded after a pass (``sys.modules``, in the main process and
in a worker) are torch's, stoker's own aside: found by a blind sweep, stoker loaded
``statistics`` (and ``decimal``, ``fractions``), ``faulthandler``, ``resource`` and
``sysconfig``, and not torch's ``multiprocessing.queues``/``synchronize``. One difference
is known and documented (docs/same_as_torch.md): stoker's record of the global RNGs loads
``numpy.random`` in the main process (torch's loader only in its workers, to seed it)."""

from __future__ import annotations

import json

import pytest
from _probe_run import run_probe

# numpy.random and what it loads: stoker's copy of the global RNG states reads numpy's
KNOWN = ("numpy.random", "secrets", "hmac", "_cython_", "cython_runtime")


def _probe(loader: str, num_workers: int, method: str, out) -> dict:
    out.mkdir()
    proc = run_probe(loader, "_modules_probe.py", str(num_workers), method, str(out))
    return json.loads(proc.stdout.splitlines()[-1])


def _known(names: list[str]) -> list[str]:
    return [n for n in names if not n.startswith(KNOWN)]


@pytest.mark.parametrize(("num_workers", "method"), [(0, "fork"), (2, "fork"), (2, "spawn")])
def test_a_pass_loads_torchs_modules(num_workers, method, tmp_path, stoker_only):
    torchs = _probe("torch", num_workers, method, tmp_path / "torch")
    stokers = _probe("stoker", num_workers, method, tmp_path / "stoker")
    assert stokers["batches"] == torchs["batches"]
    assert _known(stokers["main"]) == _known(torchs["main"])
    if num_workers:
        assert stokers["worker"] == torchs["worker"]
        assert "multiprocessing.queues" in torchs["main"]  # what the comparison covers
