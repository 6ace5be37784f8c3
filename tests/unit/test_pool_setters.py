"""Thread-pool setters are found once in the main process (inherited by forked workers) and
found again after new imports, which is how new native libraries arrive."""

from __future__ import annotations

import sys
import types

import numpy as np

from stoker.executors import thread_caps


def test_setters_are_found_once_and_again_after_an_import(monkeypatch) -> None:
    assert np.ones(2).sum() == 2.0  # numpy's BLAS is loaded
    first = thread_caps.pool_setters()
    assert any("openblas" in name for name, _ in first), first
    assert thread_caps.pool_setters() is first  # no second scan of /proc/self/maps
    monkeypatch.setitem(sys.modules, "stoker_test_new_import", types.ModuleType("new"))
    again = thread_caps.pool_setters()
    assert again is not first and [n for n, _ in again] == [n for n, _ in first]
