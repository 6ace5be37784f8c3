"""The doctor's verdict and recommendation come from one function (doctor/conclude.py) and
cannot disagree; the thread opt-ins are never tried on a dataset seen drawing from the global
RNGs (doctor/rng_probe.py); the PNG report carries the verdict line."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from stoker._core.stats import LoaderStats
from stoker.doctor.candidates import THREAD_SAFE_PROMISE, Candidate, candidates
from stoker.doctor.conclude import conclude, sweeps
from stoker.doctor.diagnose import Setup, diagnose
from stoker.doctor.measure import Run
from stoker.doctor.rng_probe import draws_global_rng
from stoker.doctor.sweep import Sweep

PROCESSES = Setup(num_workers=2, worker_type="process", cores=2)
KWARGS = {"batch_size": 8, "num_workers": 2}


def _stats(**kw) -> LoaderStats:
    base = dict(batches=100, samples=800, num_workers=2, wait_s=9.0, loop_s=1.0,
                concurrency=(1, 1))
    base.update(kw)
    return LoaderStats(**base)


def _run(rate: float) -> Run:
    return Run("r", {}, samples_per_s=rate, batches=10, seconds=1.0)


def _better_sweep() -> Sweep:
    """A thread opt-in measured +10%, three runs against three."""
    opt_in = Candidate({"worker_concurrency": 8}, THREAD_SAFE_PROMISE)
    return Sweep(baselines=[_run(100), _run(101), _run(100)],
                 tried=[(opt_in, _run(r)) for r in (110, 111, 112)])


def test_not_input_bound_is_never_followed_by_a_setting() -> None:
    # The issue: "Nothing in the loader will make training faster", then an opt-in at +10%.
    d = diagnose(_stats(wait_s=0.5, loop_s=9.5, fetch_wall_s=1.0, fetch_cpu_s=1.0), PROCESSES)
    assert d.kind == "consumer" and not sweeps(d)
    ending = conclude(d, _better_sweep(), KWARGS)
    assert ending.recommended is None
    assert ending.change == "Nothing in the loader will make training faster."
    assert ending.recommendation == (
        "RECOMMENDATION  keep your setting: the training step is the bottleneck; nothing in "
        "the loader will make training faster.",)


def test_too_busy_to_tell_recommends_no_setting() -> None:
    d = diagnose(_stats(num_workers=1, concurrency=(1,), fetch_wall_s=10.0, fetch_cpu_s=5.0,
                        fetch_queued_s=4.8, queue_measured=True),
                 Setup(num_workers=1, worker_type="process", cores=2))
    assert d.kind == "contention" and not sweeps(d)
    ending = conclude(d, _better_sweep(), KWARGS)
    assert ending.recommended is None
    assert ending.recommendation == (
        "RECOMMENDATION  keep your setting: the machine is too busy to tell (other processes "
        "hold the CPUs); run again when they leave the CPUs free.",)


def test_a_setting_the_sweep_did_not_confirm_is_not_advised() -> None:
    one = Setup(num_workers=1, worker_type="process", cores=2)
    d = diagnose(_stats(num_workers=1, concurrency=(1,), fetch_wall_s=9.0, fetch_cpu_s=9.0),
                 one)
    assert d.advice == "Use all 2 cores (num_workers=2), then make __getitem__ cheaper."
    two = Candidate({"num_workers": 2})
    sweep = Sweep(baselines=[_run(100), _run(101), _run(99)], tried=[(two, _run(102))])
    ending = conclude(d, sweep, {"batch_size": 8, "num_workers": 1})
    assert ending.recommended is None
    assert ending.change == ("No setting tried was measurably faster than yours; make "
                             "__getitem__ cheaper.")
    assert ending.recommendation == ("RECOMMENDATION  keep your setting: no setting tried was "
                                     "measurably faster than yours.",)


def test_a_recommendation_is_what_to_change() -> None:
    d = diagnose(_stats(fetch_wall_s=20.0, fetch_cpu_s=1.0), PROCESSES)
    ending = conclude(d, _better_sweep(), KWARGS)
    assert ending.recommended is not None
    assert ending.change == ("Use worker_concurrency=8: measured +11% faster on your dataset "
                             "(below).")
    assert ending.recommendation[0].startswith("RECOMMENDATION  worker_concurrency=8: 111 "
                                               "samples/s, +11% over yours")


class _Draws(torch.utils.data.Dataset):
    def __init__(self, which: str) -> None:
        self.which = which

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int) -> float:
        if self.which == "random":
            return random.random()
        if self.which == "numpy":
            return float(np.random.rand())
        if self.which == "torch":
            return float(torch.rand(()))
        return float(i)


@pytest.mark.parametrize("which", ["random", "numpy", "torch"])
def test_a_draw_from_any_global_rng_is_seen_and_the_streams_are_left_as_they_were(
        which: str) -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    assert draws_global_rng(_Draws(which)) is True
    assert random.random() == random.Random(1).random()
    assert np.random.rand() == np.random.RandomState(1).rand()
    assert torch.rand(()) == torch.rand((), generator=torch.Generator().manual_seed(1))


def test_no_draw_and_no_probe() -> None:
    assert draws_global_rng(_Draws("none")) is False
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    assert draws_global_rng(Stream()) is None


def test_no_thread_opt_in_is_tried_on_a_dataset_that_draws() -> None:
    kwargs = {"batch_size": 8, "num_workers": 2, "worker_concurrency": 1}
    found = candidates(kwargs, "storage", cores=2, cuda=False, draws_global_rng=True)
    assert found and all(not c.opt_in.startswith("opt-in: only if your __getitem__ is "
                                                 "thread-safe") for c in found)
    assert all(c.overrides.get("worker_type") != "thread"
               and c.overrides.get("worker_concurrency", 1) == 1 for c in found)
    assert dict(found[0].overrides) == {"num_workers": 8, "worker_concurrency": 1}


def test_the_png_carries_the_verdict_line() -> None:
    pytest.importorskip("matplotlib")
    from stoker.doctor.picture import png_figure

    verdict = ("Input-bound: the training loop waited for data 90% of the time. The workers are "
               "blocked off a CPU 95% of their time (I/O, remote storage or sleeps in "
               "__getitem__), one at a time per worker as in torch; 1% waiting for a CPU.")
    fig = png_figure(_run(100), None, verdict)
    assert fig.get_suptitle().replace("\n", " ") == verdict
    assert png_figure(_run(100), None, "").get_suptitle() == ""


def _drawn_texts(sweep: Sweep | None, no_sweep: str) -> list[str]:
    from matplotlib.figure import Figure

    from stoker.doctor.picture import _sweep

    ax = Figure().subplots(1, 1)
    _sweep(ax, sweep, no_sweep)
    return [t.get_text().replace("\n", " ") for t in ax.texts]


def test_the_picture_says_why_no_settings_were_tried_as_the_text_does() -> None:
    pytest.importorskip("matplotlib")
    from stoker.doctor.conclude import no_sweep_reason

    consumer = diagnose(_stats(wait_s=0.5, loop_s=9.5, fetch_wall_s=1.0, fetch_cpu_s=1.0),
                        PROCESSES)
    busy = diagnose(_stats(num_workers=1, concurrency=(1,), fetch_wall_s=10.0,
                           fetch_cpu_s=5.0, fetch_queued_s=4.8, queue_measured=True),
                    Setup(num_workers=1, worker_type="process", cores=2))
    for d in (consumer, busy):
        why = no_sweep_reason(d)
        (line,) = conclude(d, None, KWARGS).recommendation
        assert why and line == "RECOMMENDATION  keep your setting: " + why
        assert _drawn_texts(None, why) == ["no settings tried: " + why]
        assert "--no-sweep" not in _drawn_texts(None, why)[0]
    io = diagnose(_stats(fetch_wall_s=20.0, fetch_cpu_s=1.0), PROCESSES)
    assert no_sweep_reason(io) == ""  # input-bound: settings are tried
    assert no_sweep_reason(io, asked=True) == "you asked for none (--no-sweep)."
    assert no_sweep_reason(io, interrupted=True) == (
        "interrupted (Ctrl-C) during the first run.")
    assert _drawn_texts(None, no_sweep_reason(io, asked=True)) == [
        "no settings tried: you asked for none (--no-sweep)."]
