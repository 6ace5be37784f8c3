"""The calling thread's queue inside ``next()`` (NOTE [ The sampled queue has a floor ] in
engine/stats.py): sampled calls rarely hold a preemption, so the thread's whole queue over the
run, less the time spent outside ``next()``, is a floor under the sampled figure.

The thread is scripted here (its clocks and its /proc schedstat advance as the test says) so
that the preemptions land exactly where sampling does not look; the real thing, under a real
CPU hog, is tests/integration/test_verdict_under_load.py."""

from __future__ import annotations

import types

import pytest

from stoker.engine import stats as stats_module
from stoker.engine.stats import StatsAccumulator


class _ScriptedThread:
    """A thread's wall clock, CPU clock and schedstat queue, advanced by the test."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 1.0
        self.queued = 0.5
        self.reads = 0

    def schedstat(self, path: str = "") -> tuple[float, float]:
        self.reads += 1
        return self.cpu, self.queued

    def run(self, wall: float, cpu: float, queued: float = 0.0) -> None:
        self.wall += wall
        self.cpu += cpu
        self.queued += queued


@pytest.fixture
def thread(monkeypatch) -> _ScriptedThread:
    t = _ScriptedThread()
    fake_time = types.SimpleNamespace(perf_counter=lambda: t.wall, thread_time=lambda: t.cpu)
    monkeypatch.setattr(stats_module, "time", fake_time)
    monkeypatch.setattr(stats_module, "read_schedstat", t.schedstat)
    monkeypatch.setattr(stats_module, "process_queued_s", lambda: t.queued)
    return t


def _loop(t: _ScriptedThread, calls: int, body_s: float, preempt_every: int) -> StatsAccumulator:
    """``calls`` batches of 1 ms (0.3 ms on a CPU); every ``preempt_every``-th call that is
    not sampled is preempted for 10 ms; the loop body takes ``body_s`` each time."""
    acc = StatsAccumulator(num_workers=0)
    for i in range(calls):
        before = t.reads
        entered = acc.entered_next()
        sampled = t.reads > before
        t.run(0.001, 0.0003)
        if not sampled and i % preempt_every == 0:
            t.run(0.010, 0.0, queued=0.010)
        acc.left_next(entered, [None] * 8)
        t.run(body_s, body_s)
    return acc


def test_preemptions_sampling_missed_are_counted_when_next_takes_most_of_the_loop(thread):
    acc = _loop(thread, calls=400, body_s=0.00005, preempt_every=4)
    stats = acc.snapshot()
    # ~95 preemptions of 10 ms, none in a sampled call; 400 x 0.05 ms outside next()
    assert stats.main_queued_s == pytest.approx(0.95, abs=0.06), stats
    assert stats.main_cpu_s + stats.main_queued_s <= stats.wait_s + 1e-9, stats
    assert "for a CPU" in stats.summary, stats.summary


def test_a_long_loop_body_leaves_the_queue_to_sampling(thread):
    # 20 ms of step a batch: any queue could have been outside next(), so the floor is 0
    acc = _loop(thread, calls=100, body_s=0.020, preempt_every=4)
    stats = acc.snapshot()
    assert stats.main_queued_s == 0.0, stats


def test_the_floor_never_exceeds_the_time_in_next(thread):
    acc = _loop(thread, calls=200, body_s=0.0, preempt_every=1)
    stats = acc.snapshot()
    assert 0.0 < stats.main_queued_s <= stats.wait_s, stats
