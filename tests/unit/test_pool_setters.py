"""Thread-pool setters are found once in the main process (inherited by forked workers) and
found again after new imports, which is how new native libraries arrive."""

from __future__ import annotations

import sys
import types

import numpy as np
from threadpoolctl import threadpool_info

from stoker.workers import thread_caps


def test_setters_are_found_once_and_again_after_an_import(monkeypatch) -> None:
    assert np.ones(2).sum() == 2.0  # numpy's BLAS is loaded
    first = thread_caps.pool_setters()
    blas = [p for p in first if "openblas" in p.name]
    assert blas, first
    # numpy's OpenBLAS exports the count a forked worker writes (NOTE [ OpenBLAS after fork ])
    assert blas[0].blas_count is not None
    counts = [p["num_threads"] for p in threadpool_info() if p["internal_api"] == "openblas"]
    assert blas[0].blas_count.value in counts  # the count OpenBLAS's own getter reports
    assert thread_caps.pool_setters() is first  # no second scan of /proc/self/maps
    monkeypatch.setitem(sys.modules, "stoker_test_new_import", types.ModuleType("new"))
    again = thread_caps.pool_setters()
    assert again is not first and [p.name for p in again] == [p.name for p in first]
