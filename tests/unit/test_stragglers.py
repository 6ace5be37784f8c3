"""StragglerWatch: which running batch counts as a straggler (NOTE [ Only stragglers move ]).

Its reading of a real process's CPU time is tested in
``tests/integration/test_straggler_cpu.py`` (it starts processes)."""

from __future__ import annotations

import pytest

from stoker.engine.stragglers import StragglerWatch


def test_not_before_four_usual_batches_and_50_ms():
    watch = StragglerWatch(2)
    watch.started(0, 0.0)
    watch.finished(0, 0.1)  # a 100 ms batch: the next counts from 0.1 + 4 x 0.1
    assert watch.batch_s == pytest.approx(0.1)
    assert watch.due(0) == pytest.approx(0.5)
    assert not watch.straggling(0, None, 0.49)
    assert watch.straggling(0, None, 0.5)  # no pid to look at: the wall time decides
    watch.started(1, 0.0)
    watch.batch_s = 0.001  # tiny batches: the 50 ms floor
    assert watch.due(1) == pytest.approx(0.05)


def test_a_new_batch_starts_afresh():
    watch = StragglerWatch(1)
    watch.started(0, 0.0)
    assert watch.straggling(0, None, 1.0)
    watch.finished(0, 1.0)
    assert not watch.straggling(0, None, 1.01)
