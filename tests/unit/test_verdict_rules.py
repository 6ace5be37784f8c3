"""The verdict's rule table (profile/rules.py), rule by rule, on made-up figures: each rule
fires on its own condition, says its reason, and gives its advice; no advice repeats the
current setting, and no thread opt-in is offered to a dataset seen drawing from the global
RNGs."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from stoker._core.stats import LoaderStats, TunerEvent
from stoker.profile import rules
from stoker.profile.rules import RULES, Device, Figures, judge
from stoker.profile.timesplit import TimeSplit, fetching

TESTED: set[str] = set()


def _figures(cpu: float = 9.0, queued: float = 0.0, blocked: float = 0.0, **kw: Any) -> Figures:
    base: dict[str, Any] = dict(
        wait_s=9.0, loop_s=1.0, mode="process", num_workers=2, cores=2, concurrency=1,
        fetch_cpu_s=cpu, current={"num_workers": 2, "worker_type": "process"})
    base.update(kw)
    if "fetch" not in base:
        base["fetch"] = TimeSplit("the workers", cpu, queued, blocked)
    return Figures(**base)


def _judged(rule: str, f: Figures) -> rules.Verdict:
    v = judge(f)
    assert v.rule == rule, (v.rule, v.reason)
    TESTED.add(rule)
    return v


def test_rule_device_copy() -> None:
    f = _figures(wait_s=0.5, loop_s=9.5, device=Device(wait_s=3.0, copy_s=9.0,
                                                      bytes=100 * 2**20, batches=100))
    v = _judged("device_copy", f)
    assert v.reason.startswith("the training stream waited 30% of the time")
    assert v.advice.text.startswith("host-to-device bandwidth is the bottleneck")


def test_rule_consumer() -> None:
    v = _judged("consumer", _figures(wait_s=0.5, loop_s=9.5))
    assert not v.input_bound and v.reason == "the training step is the bottleneck"
    assert v.advice == rules.Advice("nothing in the loader will make training faster")


def test_rule_device_queuing() -> None:
    v = _judged("device_queuing", _figures(device=Device(to_device_s=6.0)))
    assert v.reason.startswith("queuing the copies to the device takes 67% of the time")


def test_rule_gil() -> None:
    # 4 fetch threads in the training process, off a CPU 60% of their time while the process
    # keeps 0.8 of a core busy: they wait for each other.
    f = _figures(mode="thread", num_workers=0, concurrency=4, cpu=8.0, fetch_cpu_s=8.0,
                 fetch=TimeSplit("the fetch threads", 8.0, 0.0, 12.0),
                 current={"num_workers": 0, "worker_type": "thread"})
    v = _judged("gil", f)
    assert "they wait for the GIL, not storage (inferred" in v.reason
    assert v.advice.settings == {"worker_type": "process", "num_workers": 2}


def test_rule_storage() -> None:
    v = _judged("storage", _figures(cpu=1.0, queued=0.5, blocked=18.5))
    assert v.reason == ("the workers are blocked off a CPU 92% of their time (I/O, remote "
                        "storage or sleeps in __getitem__), one at a time per worker as in "
                        "torch; 2% waiting for a CPU")
    assert v.advice.settings == {"num_workers": 4} and v.advice.opt_in
    assert "worker_concurrency=" in v.advice.text


def test_rule_oversubscribed() -> None:
    f = _figures(num_workers=4, cpu=5.0, queued=4.8, blocked=0.2,
                 current={"num_workers": 4, "worker_type": "process"})
    v = _judged("oversubscribed", f)
    assert "4 fetches want to run at once on the machine's 2 cores" in v.reason
    assert v.advice.text == "use num_workers=2, or make __getitem__ cheaper"


def test_rule_contention() -> None:
    # The case: an in-memory dataset loaded in the calling thread on a loaded
    # machine. Its next() calls ran 20% of their time and queued 75%: not I/O.
    f = _figures(mode="main", num_workers=0, cpu=2.0,
                 fetch=TimeSplit("the training thread's next() calls", 2.0, 6.8, 0.2),
                 current={"num_workers": 0, "worker_type": "auto"})
    v = _judged("contention", f)
    assert "I/O" not in v.reason and "too busy to tell" in v.reason
    assert "wait 76% of their time for a CPU" in v.reason
    assert not v.advice.settings


def test_rule_contention_when_the_queue_cannot_be_read() -> None:
    split = TimeSplit("the workers", 1.0, 0.0, 9.0, queue_measured=False)
    v = _judged("contention", _figures(cpu=1.0, fetch=split, cpu_idle_share=0.02))
    assert v.reason.endswith("the machine's CPUs were 98% busy, and this system does not say "
                             "how much of that was waiting for a CPU: the machine is too busy "
                             "to tell")
    # With a CPU free (or nothing known) the same figures are waiting on storage.
    assert judge(_figures(cpu=1.0, fetch=split, cpu_idle_share=0.5)).rule == "storage"
    assert judge(_figures(cpu=1.0, fetch=split)).rule == "storage"


def test_rule_threads() -> None:
    f = _figures(mode="thread", num_workers=2, concurrency=2, cpu=2.5, fetch_cpu_s=2.5,
                 fetch=TimeSplit("the fetch threads", 2.5, 0.0, 0.0))
    v = _judged("threads", f)
    assert v.kind == "gil" and "shares one GIL with the loop" in v.reason


def test_rule_main_thread() -> None:
    f = _figures(mode="main", num_workers=0, current={"num_workers": 0, "worker_type": "auto"})
    v = _judged("main_thread", f)
    assert v.advice.text == "load in worker processes: num_workers=2 (this machine has 2 cores)"
    gathers = judge(_figures(mode="main", inline_gathers=True))
    assert gathers.reason.startswith("batches are array gathers done in the training process")


def test_rule_transfer() -> None:
    v = _judged("transfer", _figures(cpu=4.0, unpack_s=4.0))
    assert v.reason.startswith("moving batches from the workers to the main process")
    assert v.advice.settings == {"beyond_torch": {"slab_transport"}}
    assert v.advice.text.endswith(
        "; or beyond_torch={'slab_transport'}: batches collated straight into reused "
        "shared-memory slabs, one descriptor sent per batch (beyond torch: is_shared() is "
        "False, a view of a larger tensor arrives compact, leaves that alias arrive as "
        "separate tensors)")


def test_transfer_with_slabs_already_on_is_not_told_to_turn_them_on() -> None:
    current = {"num_workers": 2, "worker_type": "process",
               "beyond_torch": ("deep_prefetch", "slab_transport")}
    v = judge(_figures(cpu=4.0, unpack_s=4.0, current=current))
    assert v.rule == "transfer"
    assert v.advice.text == ("use larger batches, or fewer Python objects per batch "
                             "(tensors/arrays instead of lists of numbers or strings)")
    assert not v.advice.settings


def test_rule_collate() -> None:
    v = _judged("collate", _figures(cpu=2.0, collate_s=6.0))
    assert v.reason == "the workers spend more time collating (6.00 s) than fetching (2.00 s)"


def test_rule_cpu() -> None:
    f = _figures(num_workers=1, current={"num_workers": 1, "worker_type": "process"})
    v = _judged("cpu", f)
    assert v.advice.text == "use all 2 cores (num_workers=2), then make __getitem__ cheaper"


def test_every_rule_has_its_test() -> None:
    # Runs last in this file (pytest keeps the file's order).
    assert {r.name for r in RULES} <= TESTED


# -- the promises: never the current setting, never a broken opt-in ------------------------------


def test_two_workers_on_two_cores_are_not_told_to_use_two_workers() -> None:
    # The issue: "Use all 2 cores (num_workers=2)" to num_workers=2.
    v = judge(_figures())
    assert v.rule == "cpu" and not v.advice.settings
    assert v.advice.text == ("make __getitem__ cheaper (faster decoding, smaller images): the 2 "
                             "workers already use the machine's 2 cores")
    assert "num_workers=2" not in v.advice.text and "num_workers <= 2" not in v.advice.text


def test_a_setting_equal_to_the_current_one_falls_back_to_the_rest_of_the_advice() -> None:
    # A rule that would propose what the loader has: judge keeps only the other part.
    f = _figures(mode="thread", num_workers=2, concurrency=2, cpu=2.5, fetch_cpu_s=2.5,
                 fetch=TimeSplit("the fetch threads", 2.5, 0.0, 0.0),
                 current={"num_workers": 2, "worker_type": "process"})
    assert judge(f).advice == rules.Advice("make __getitem__ cheaper")


def test_a_dataset_drawing_from_the_global_rngs_is_not_offered_threads() -> None:
    f = _figures(cpu=1.0, blocked=19.0, draws_global_rng=True)
    v = judge(f)
    assert v.rule == "storage" and not v.advice.opt_in
    assert "worker_concurrency" not in v.advice.text.replace("(threads inside", "")
    assert v.advice.text == ("run more fetches at once: num_workers=4 (threads inside a worker "
                             "are out: __getitem__ draws from the global RNGs, so it is not "
                             "thread-safe in stoker's sense)")


def test_the_tuners_rng_finding_counts_as_drawing() -> None:
    stats = LoaderStats(batches=10, num_workers=2, wait_s=9.0, loop_s=1.0, fetch_wall_s=20.0,
                        fetch_cpu_s=1.0, concurrency=(1, 1),
                        tuner=(TunerEvent(0, 0.1, 1, "__getitem__ draws from a global RNG "
                                          "(random/numpy/torch); ..."),))
    assert rules.from_stats(stats, 2, "process").draws_global_rng is True


_GRID = itertools.product(
    ("main", "process", "thread"), (0, 1, 2, 4), (1, 4), (0.0, 5.0), (0.0, 8.0), (0.0, 18.0),
    (None, True, False))


@pytest.mark.parametrize("grid", [list(_GRID)])
def test_no_advice_repeats_the_setting_or_breaks_the_rng_promise(grid: list) -> None:
    for mode, n, conc, queued, blocked, collate, rng in grid:
        current = {"num_workers": n, "worker_type": "thread" if mode == "thread"
                   else "process" if n else "auto"}
        f = _figures(mode=mode, num_workers=n, concurrency=conc, cpu=2.0, queued=queued,
                     blocked=blocked, collate_s=collate, draws_global_rng=rng, current=current)
        advice = judge(f).advice
        assert not advice.settings or any(current.get(k, rules._DEFAULTS.get(k)) != v
                                          for k, v in advice.settings.items()), (f, advice)
        if rng:
            assert not advice.opt_in and "worker_concurrency" not in advice.settings, (f, advice)
            assert "if __getitem__ is thread-safe" not in advice.text, (f, advice)


def test_the_calling_threads_split_is_what_next_measured() -> None:
    s = LoaderStats(batches=10, num_workers=0, wait_s=8.0, loop_s=1.0, fetch_wall_s=7.5,
                    fetch_cpu_s=1.5, main_cpu_s=2.0, main_queued_s=5.5, queue_measured=True)
    split = fetching(s)
    assert (split.cpu_s, split.queued_s, split.blocked_s) == (2.0, 5.5, 0.5)
    assert rules.from_stats(s, 2).mode == "main"
