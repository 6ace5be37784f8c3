"""`stoker doctor`'s parts on synthetic runs: noise and ranking of the sweep, the machine's
load, the trace-event JSON, a run through JSON and back, the text report."""

from __future__ import annotations

import json

import pytest

from stoker._core.stats import LoaderStats, TunerEvent
from stoker.doctor.candidates import THREAD_SAFE_PROMISE, Candidate
from stoker.doctor.diagnose import Setup, diagnose
from stoker.doctor.machine import Load, LoadMark, between
from stoker.doctor.measure import MemorySample, Run
from stoker.doctor.records import plain_kwargs, run_from_dict, run_to_dict
from stoker.doctor.report import Context, render
from stoker.doctor.sweep import Sweep, mann_whitney_p, run_sweep
from stoker.doctor.trace import trace_events
from stoker.profile.events import EventRecorder
from stoker.workers.protocol import BatchReport


def _run(rate: float, label: str = "your setting", **overrides) -> Run:
    return Run(label, dict(overrides), samples_per_s=rate, batches=10, seconds=1.0)


def _sweep() -> Sweep:
    two = Candidate({"num_workers": 2})
    sweep = Sweep(baselines=[_run(100), _run(104), _run(96)])
    sweep.tried = [
        (two, _run(150, num_workers=2)),
        (Candidate({"prefetch_factor": 4}), _run(105, prefetch_factor=4)),
        (Candidate({"worker_concurrency": 8}, THREAD_SAFE_PROMISE),
         Run("c", {}, error="ValueError: no")),
        (two, _run(148, num_workers=2)),
        (two, _run(152, num_workers=2)),
    ]
    return sweep


def test_noise_is_half_the_baselines_spread_and_sets_the_margin() -> None:
    sweep = _sweep()
    assert sweep.baseline_rate == 100
    assert sweep.noise == pytest.approx(0.04) and sweep.margin == pytest.approx(0.08)
    assert [r.samples_per_s for _, r in sweep.ranked()] == [150, 105]  # failed one left out
    best = sweep.best()
    assert best is not None and dict(best[0].overrides) == {"num_workers": 2}


def test_one_fast_run_is_not_a_recommendation() -> None:
    sweep = _sweep()
    sweep.tried = sweep.tried[:3]  # num_workers=2 ran once: +50%, but one run proves nothing
    assert sweep.best() is None


def test_no_recommendation_within_the_noise() -> None:
    sweep = _sweep()
    four = sweep.tried[1][0]
    sweep.tried = [(four, _run(105)), (four, _run(106)), (four, _run(107))]
    assert sweep.p_value(four) == pytest.approx(0.05) and sweep.best() is None  # +6% < 8%


def test_a_small_noise_still_needs_five_percent() -> None:
    x = Candidate({"x": 1})
    sweep = Sweep(baselines=[_run(100), _run(100), _run(100)],
                  tried=[(x, _run(104)), (x, _run(104)), (x, _run(104))])
    assert sweep.margin == 0.05 and sweep.best() is None


def test_mann_whitney_p_is_exact() -> None:
    assert mann_whitney_p([3, 4, 5], [1, 2, 2.5]) == pytest.approx(1 / 20)
    assert mann_whitney_p([3, 4, 5, 6], [1, 2, 2.5]) == pytest.approx(1 / 35)
    assert mann_whitney_p([1, 2, 3], [1, 2, 3]) == pytest.approx(0.5)
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == 1.0


def test_a_candidate_with_one_slow_run_is_not_measurably_better() -> None:
    x = Candidate({"x": 1})
    sweep = Sweep(baselines=[_run(100), _run(101), _run(99)],
                  tried=[(x, _run(150)), (x, _run(90)), (x, _run(160))])
    assert sweep.gain(x) == pytest.approx(0.5) and sweep.p_value(x) > 0.05
    assert sweep.best() is None


def test_settings_within_the_margin_of_each_other_give_the_one_listed_first() -> None:
    # Both are measurably better; b is 3% faster, less than the 5% margin: noise, so the
    # recommendation is a, listed first, and does not swap from one run of the doctor to
    # the next.
    a, b = Candidate({"num_workers": 2}), Candidate({"prefetch_factor": 4})
    sweep = Sweep(baselines=[_run(100), _run(100), _run(100)], order=[a, b])
    sweep.tried = [(b, _run(r)) for r in (153, 154, 155)] + [(a, _run(r)) for r in (149, 150,
                                                                                     151)]
    assert [c for c, _ in sweep.ranked()] == [b, a]
    best = sweep.best()
    assert best is not None and best[0] == a
    sweep.tried += [(b, _run(r)) for r in (170, 171, 172, 173)]  # now b is clearly faster
    best = sweep.best()
    assert best is not None and best[0] == b


def test_a_busy_machine_needs_a_larger_gain() -> None:
    x = Candidate({"x": 1})
    busy = Load(others_cores=1.5, steal_share=0.0, known=True)
    sweep = Sweep(baselines=[Run("y", {}, samples_per_s=r, load=busy) for r in (100, 100, 100)],
                  tried=[(x, _run(r)) for r in (118, 119, 120)], cores=2)
    assert sweep.busy and sweep.margin == 0.25 and sweep.best() is None


class _Rates:
    """A measure_one whose rates are fixed per label (in turn), counting runs."""

    def __init__(self, rates: dict[str, list[float]]) -> None:
        self.rates = {k: list(v) for k, v in rates.items()}
        self.calls: list[str] = []

    def __call__(self, label: str, overrides: dict) -> Run:
        self.calls.append(label)
        rates = self.rates[label]
        rate = rates.pop(0) if len(rates) > 1 else rates[0]
        return Run(label, overrides, samples_per_s=rate, batches=10, seconds=1.0)


def test_the_leaders_are_measured_again_until_the_ranking_is_significant() -> None:
    fast, slow = Candidate({"num_workers": 2}), Candidate({"prefetch_factor": 4})
    rates = _Rates({"your setting": [100, 102, 98, 101, 99, 100],
                    "num_workers=2": [150, 149, 151], "prefetch_factor=4": [101]})
    sweep = run_sweep(rates, [fast, slow])
    assert rates.calls.count("num_workers=2") == 3  # until 3 runs beat every one of yours
    assert rates.calls.count("prefetch_factor=4") == 1  # never ahead: not measured again
    best = sweep.best()
    assert best is not None and best[0] == fast and sweep.p_value(fast) <= 0.05


def test_a_leader_that_does_not_hold_up_is_dropped() -> None:
    lucky = Candidate({"num_workers": 2})
    rates = _Rates({"your setting": [100, 101, 99, 100, 100, 100, 100],
                    "num_workers=2": [140, 100, 99, 101, 100]})
    sweep = run_sweep(rates, [lucky])
    assert 2 <= rates.calls.count("num_workers=2") <= 5
    assert sweep.best() is None


def test_load_counts_other_processes_and_steal() -> None:
    a = LoadMark(busy_s=100.0, steal_s=1.0, total_s=1000.0, own_s=10.0, ok=True)
    # 10 s of wall on 2 cores: 20 CPU-s passed, 16 busy of which 6 were ours, 4 stolen.
    b = LoadMark(busy_s=116.0, steal_s=5.0, total_s=1020.0, own_s=16.0, ok=True)
    load = between(a, b, 10.0)
    assert load.others_cores == pytest.approx(1.0) and load.steal_share == pytest.approx(0.2)
    assert load.busy(2)
    assert not Load(0.1, 0.0, True).busy(2) and not Load(5.0, 0.5, False).busy(2)


def _report(fetch_wall_s: float, packed_at: float) -> BatchReport:
    return BatchReport(concurrency=1, fetch_wall_s=fetch_wall_s, fetch_cpu_s=fetch_wall_s,
                       collate_s=0.01, pack_s=0.002, decisions=(), batched="", queued_s=0.0,
                       gives_back=False, init_fn_seeded=False, packed_at=packed_at)


def _recorded_run() -> Run:
    rec = EventRecorder()
    rec.started = 10.0
    for k in range(4):
        t = 10.1 + 0.1 * k
        rec.worker_batch(k % 2, _report(0.05, t), t + 0.001)
        rec.step(t - 0.02, t + 0.002, 8)
        rec.main_stage("unpack", t + 0.001, t + 0.002)
    rec.worker_batch(0, _report(1.0, 11.5), 11.501)  # a straggler: 1 s of fetching
    memory = [MemorySample(10.2, 123, "main", 100.0, 50.0)]
    return Run("your setting", {}, samples_per_s=80.0, batches=4, samples=32, seconds=0.4,
               events=rec, memory=memory, started=10.0, warm_at=10.2,
               batch_times=[(10.102 + 0.1 * k, 8) for k in range(4)],
               stats=LoaderStats(batches=4, concurrency=(1, 2),
                                 tuner=(TunerEvent(0, 0.1, 2, "why"),)))


def test_trace_has_every_stage_as_complete_events_on_valid_lanes() -> None:
    events = json.loads(json.dumps(trace_events(_recorded_run())))
    complete = [e for e in events if e["ph"] == "X"]
    names = [e["name"] for e in complete]
    assert names.count("fetch") == 4 and names.count("fetch (straggler)") == 1
    assert names.count("collate") == 5 and names.count("pack") == 5
    assert names.count("wait") == 4 and names.count("step") == 3
    assert names.count("unpack") == 4
    for e in complete:
        assert {"name", "ph", "pid", "tid", "ts", "dur"} <= set(e) and e["dur"] >= 0
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"training process", "main loop", "main: receive", "worker 0", "worker 1"} <= lanes
    counters = [e for e in events if e["ph"] == "C"]
    assert any(e["name"] == "samples/s" for e in counters)
    assert any(e["name"] == "memory main 123 (MiB)" and e["args"]["PSS"] == 100.0
               for e in counters)
    first_fetch = next(e for e in complete if e["name"] == "fetch" and e["pid"] == 100)
    assert first_fetch["ts"] == pytest.approx((10.1 - 0.002 - 0.01 - 0.05 - 10.0) * 1e6)


def test_a_run_survives_json() -> None:
    run = _recorded_run()
    back = run_from_dict(json.loads(json.dumps(run_to_dict(run))))
    assert back.stats == run.stats and back.memory == run.memory
    assert back.batch_times == run.batch_times and back.warm_at == run.warm_at
    assert back.events is not None and run.events is not None
    assert back.events.worker_batches() == run.events.worker_batches()
    assert back.events.steps() == run.events.steps()


def test_plain_kwargs_marks_dropped_objects() -> None:
    assert plain_kwargs({"batch_size": 8, "sampler": object(), "timeout": 0.5}) == {
        "batch_size": 8, "timeout": 0.5, "...": True}


def test_report_names_verdict_table_and_the_line_to_write() -> None:
    run = _recorded_run()
    run.stats = LoaderStats(batches=100, samples=800, num_workers=1, wait_s=9.0, loop_s=1.0,
                            fetch_wall_s=9.0, fetch_cpu_s=9.0, concurrency=(1,))
    setup = Setup(num_workers=1, worker_type="process", cores=2)
    ctx = Context("mod:make", {"batch_size": 8, "num_workers": 1}, setup, 0.0)
    text = render(ctx, run, diagnose(run.stats, setup), _sweep())
    assert "VERDICT  Input-bound: the training loop waited for data 90% of the time." in text
    assert "your setting: stoker.DataLoader(dataset, batch_size=8, num_workers=1)" in text
    lines = text.splitlines()
    table = lines.index(next(x for x in lines if x.startswith("What to change")))
    assert "+50%   num_workers=2 [3 runs]  better" in lines[table + 2]
    assert "your setting (median of 3 runs: 100 104 96)" in lines[table + 4]
    assert "failed" in text and "ValueError: no" in text
    assert ("noise: ±4% between your setting's runs; a setting counts as better above 8%, its "
            "runs against yours significant (3 or more runs, one-sided Mann-Whitney p <= "
            "0.05).") in text
    assert "  what to change: Use num_workers=2: measured +50% faster on your dataset (below)." \
        in lines
    assert lines[-2] == ("RECOMMENDATION  num_workers=2: 150 samples/s, +50% over yours (100; "
                         "median of 3 runs, p=0.05)")
    assert lines[-1] == "  stoker.DataLoader(dataset, batch_size=8, num_workers=2)"


def test_report_shows_the_loaders_advice_the_logs_keep_at_debug() -> None:
    """stoker's advice on a run that works is logged at DEBUG only (a run silent under torch
    stays silent): the doctor's report is where it shows, under ADVICE, one line each."""
    run = _recorded_run()
    advice = ("stoker: dataset.rng is a numpy.random._generator.Generator created before the "
              "workers started; ...", "stoker: DataLoader worker memory keeps growing: ...")
    setup = Setup(num_workers=1, worker_type="process", cores=2)
    ctx = Context("mod:make", {"batch_size": 8, "num_workers": 1}, setup, 0.0)
    for given, shown in (((), []), (advice, ["ADVICE", *(f"  {a}" for a in advice)])):
        run.stats = LoaderStats(batches=100, samples=800, num_workers=1, wait_s=9.0, loop_s=1.0,
                                fetch_wall_s=9.0, fetch_cpu_s=9.0, concurrency=(1,),
                                advice=given)
        lines = render(ctx, run, diagnose(run.stats, setup), None).splitlines()
        assert ("ADVICE" in lines) == bool(given)  # no advice, no heading
        start = lines.index("ADVICE") if given else len(lines)
        assert lines[start:start + len(shown)] == shown


def test_png_report_draws_the_run_and_the_sweep(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from stoker.doctor.picture import write_report

    path = tmp_path / "report.png"
    write_report(str(path), _recorded_run(), _sweep())
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    from matplotlib.image import imread

    pixels = imread(str(path))
    assert pixels.shape[0] > 500 and pixels.shape[1] > 500
    assert (pixels[..., :3].std(axis=(0, 1)) > 0.05).all()  # drawn, not a blank canvas


def test_report_path_must_say_html_or_png() -> None:
    from stoker.doctor.picture import check_report_path

    assert check_report_path("out.pdf") == (
        "stoker doctor: --report 'out.pdf': expected a file name ending in .html or .png "
        "(the format follows the extension).")
    assert check_report_path("out.HTML") == ""
