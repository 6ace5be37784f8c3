"""What the loader records for the doctor and for users' own tools: the flat stats dict,
collect_stats=False, the per-batch timeline (off unless asked) and torch.profiler ranges.
No processes here: num_workers=0 (the worker timeline is in tests/integration)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

import stoker
from stoker._core.stats import LoaderStats
from stoker.engine.stats import NoStats, StatsAccumulator
from stoker.profile.events import EventRecorder
from stoker.workers.protocol import BatchReport


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i * i])


def test_as_dict_is_flat_numbers_with_rate_and_wait_share() -> None:
    stats = LoaderStats(batches=10, samples=640, num_workers=2, wait_s=1.0, loop_s=3.0,
                        fetch_cpu_s=0.5, inline=True, concurrency=(1, 4), summary="text")
    d = stats.as_dict()
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in d.values())
    assert d["samples_per_s"] == 160.0 and d["wait_share"] == 0.25
    assert d["concurrency_max"] == 4 and d["inline"] == 1.0 and d["batches"] == 10
    assert "summary" not in d and "tuner" not in d and "concurrency" not in d


def test_as_dict_before_any_batch_has_zero_rate() -> None:
    d = LoaderStats().as_dict()
    assert d["samples_per_s"] == 0.0 and d["wait_share"] == 0.0 and d["concurrency_max"] == 0


def test_collect_stats_false_measures_nothing_and_says_so() -> None:
    loader = stoker.DataLoader(_Squares(), batch_size=4, collect_stats=False)
    assert isinstance(loader._engine.stats, NoStats)
    assert len(list(loader)) == 10
    stats = loader.stats()
    assert stats.batches == 0 and stats.wait_s == 0.0
    assert str(stats) == "stoker: stats are off (collect_stats=False)."


def test_collect_stats_default_counts_batches() -> None:
    loader = stoker.DataLoader(_Squares(), batch_size=4)
    assert type(loader._engine.stats) is StatsAccumulator
    list(loader)
    assert loader.stats().batches == 10 and loader.stats().samples == 40


def test_events_are_off_by_default_and_recorded_when_asked() -> None:
    loader = stoker.DataLoader(_Squares(), batch_size=4)
    assert loader._engine.stats.events is None
    recorder = loader.record_timeline()
    list(loader)
    steps = recorder.steps()
    assert len(steps) == 10 and all(s.samples == 4 and s.left >= s.entered for s in steps)
    stages = recorder.main_stages()
    assert [s.name for s in stages[:2]] == ["fetch", "collate"] and len(stages) == 20
    assert all(s.end >= s.start for s in stages)
    loader.stop_timeline()
    list(loader)
    assert len(recorder.steps()) == 10  # nothing more once stopped


def test_recorder_keeps_only_the_newest() -> None:
    recorder = EventRecorder(max_batches=3)
    for k in range(5):
        recorder.step(float(k), float(k) + 0.5, 1)
        report = BatchReport(
            concurrency=1, fetch_wall_s=0.1, fetch_cpu_s=0.1, collate_s=0.2, pack_s=0.3,
            decisions=(), batched="", queued_s=0.0, gives_back=False, init_fn_seeded=False,
            packed_at=k + 1.0,
        )
        recorder.worker_batch(k % 2, report, k + 1.5)
    assert [s.entered for s in recorder.steps()] == [2.0, 3.0, 4.0]
    last = recorder.worker_batches()[-1]
    assert last.worker_id == 0 and last.sent == 5.0 and last.received == 5.5
    assert abs(last.pack_start - 4.7) < 1e-9 and abs(last.collate_start - 4.5) < 1e-9
    assert abs(last.fetch_start - 4.4) < 1e-9


def test_a_profiler_sees_torchs_range_and_stokers_only_when_asked() -> None:
    # torch's range on every next(), as torch's iterator opens it; stoker's own are beyond
    # torch (a trace would list ranges torch's does not)
    torchs = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    loader = stoker.DataLoader(_Squares(), batch_size=4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        list(loader)
    names = [e.name for e in prof.events()]
    assert names.count(torchs) == 11  # 10 batches and the StopIteration
    assert not [name for name in names if name.startswith("stoker")]

    loader = stoker.DataLoader(_Squares(), batch_size=4, beyond_torch={"profiler_ranges"})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        list(loader)
    names = [e.name for e in prof.events()]
    assert names.count(torchs) == 11
    assert names.count("stoker: next()") == 11
    assert names.count("stoker: fetch (dataset __getitem__)") == 10
    assert names.count("stoker: collate") == 10


class _Counter:
    """A StatsHook that keeps what it is told."""

    def __init__(self) -> None:
        self.told: list[tuple[int, float]] = []
        self.last_batches = -1

    def batch_delivered(self, samples: int, at: float, stats: Any) -> None:
        self.told.append((samples, at))
        self.last_batches = stats().batches


@pytest.mark.parametrize("collect", [True, False])
def test_a_stats_hook_is_told_of_every_batch_until_removed(collect: bool) -> None:
    loader = stoker.DataLoader(_Squares(), batch_size=4, collect_stats=collect)
    hook = _Counter()
    loader.add_stats_hook(hook)
    assert len(list(loader)) == 10
    assert [s for s, _ in hook.told] == [4] * 10
    assert all(a <= b for (_, a), (_, b) in itertools.pairwise(hook.told))
    assert hook.last_batches == (10 if collect else 0)  # collect_stats=False: no figures
    loader.remove_stats_hook(hook)
    list(loader)
    assert len(hook.told) == 10


def test_a_stats_hook_outlives_a_change_of_num_workers() -> None:
    loader = stoker.DataLoader(_Squares(), batch_size=4, num_workers=2)
    hook = _Counter()
    loader.add_stats_hook(hook)
    recorder = loader.record_timeline()
    loader.num_workers = 0  # set after construction, as torch allows (no processes here)
    assert len(list(loader)) == 10
    assert len(hook.told) == 10 and len(recorder.steps()) == 10
    assert loader.stats().num_workers == 0 and loader.plan().executor == "calling_thread"


def test_add_stats_hook_refuses_what_is_not_a_hook() -> None:
    loader = stoker.DataLoader(_Squares(), batch_size=4)
    with pytest.raises(TypeError, match="batch_delivered"):
        loader.add_stats_hook(print)  # type: ignore[arg-type]


def _worker_report(wall: float, cpu: float, queued: float) -> BatchReport:
    return BatchReport(concurrency=1, fetch_wall_s=wall, fetch_cpu_s=cpu, collate_s=0.25,
                       pack_s=0.125, decisions=(), batched="", queued_s=queued,
                       gives_back=False, init_fn_seeded=False, packed_at=1.0)


def test_worker_times_are_named_and_add_up_to_the_totals() -> None:
    import dataclasses
    import json

    from stoker._core.stats import WorkerTimes
    from stoker.doctor.measure import Run, stats_between
    from stoker.doctor.records import run_from_dict, run_to_dict

    acc = StatsAccumulator(num_workers=2)
    acc.worker_batch(1, _worker_report(1.0, 0.5, 2.0))  # queued over all it did: > its wall
    acc.worker_batch(0, _worker_report(0.5, 0.25, 0.0))
    acc.worker_batch(1, _worker_report(1.0, 0.5, 0.5))
    stats = acc.snapshot()
    assert stats.worker_times == (WorkerTimes(0.5, 0.25, 0.0, 0.375),
                                  WorkerTimes(2.0, 1.0, 2.5, 0.75))
    w1 = stats.worker_times[1]
    assert (w1.fetch_wall_s, w1.fetch_cpu_s, w1.queued_s, w1.collate_pack_s) == (
        2.0, 1.0, 2.5, 0.75)
    wall, cpu, queued, other = w1  # still a tuple
    assert sum(w.fetch_wall_s for w in stats.worker_times) == stats.fetch_wall_s == 2.5
    assert sum(w.fetch_cpu_s for w in stats.worker_times) == stats.fetch_cpu_s == 1.25
    assert sum(w.queued_s for w in stats.worker_times) == stats.fetch_queued_s == 2.5
    assert sum(w.collate_pack_s for w in stats.worker_times) == (
        stats.collate_s + stats.pack_s)
    # the docstring says why queued time may exceed the fetch wall time
    doc = " ".join((LoaderStats.__doc__ or "").split())
    assert "It is not a part of ``fetch_wall_s`` and can exceed it" in doc
    # the doctor's difference of two snapshots and its JSON round trip keep the names
    later = dataclasses.replace(stats, worker_times=(WorkerTimes(1.0, 0.5, 0.5, 1.0),
                                                     WorkerTimes(3.0, 2.0, 3.0, 1.0)))
    diff = stats_between(stats, later)
    assert diff.worker_times == (WorkerTimes(0.5, 0.25, 0.5, 0.625),
                                 WorkerTimes(1.0, 1.0, 0.5, 0.25))
    assert all(type(w) is WorkerTimes for w in diff.worker_times)
    back = run_from_dict(json.loads(json.dumps(run_to_dict(Run("r", {}, stats=stats)))))
    assert back.stats.worker_times == stats.worker_times
    assert all(type(w) is WorkerTimes for w in back.stats.worker_times)
