"""The tuner's probe decisions, fed with synthetic per-sample timings (no clocks involved)."""

from __future__ import annotations

from stoker.fetch.concurrency import _PROBE_SAMPLES, ConcurrencyTuner


def _probe(tuner: ConcurrencyTuner, samples: list[tuple[float, float, float]]) -> None:
    for wall, cpu, queued in samples:
        tuner.observe_sample(wall, cpu, touched_rng=False, queued_s=queued)


def test_cpu_bound_samples_settle_at_one():
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=True)
    _probe(tuner, [(1e-3, 0.95e-3, 0.0)] * _PROBE_SAMPLES)
    assert tuner.concurrency == 1 and not tuner.exploring
    assert tuner.decisions[-1].reason.startswith("fetches keep a CPU busy")


def test_a_few_stalled_samples_do_not_make_a_cpu_bound_dataset_look_waiting():
    # A busy host stole 20 ms from three of the samples: wall grew, CPU did not.
    stalled = [(21e-3, 1e-3, 0.0)] * 3
    normal = [(1e-3, 0.97e-3, 0.0)] * (_PROBE_SAMPLES - 3)
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=True)
    _probe(tuner, stalled + normal)
    assert tuner.concurrency == 1 and not tuner.exploring


def test_waiting_samples_start_above_one():
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=True)
    _probe(tuner, [(8e-3, 0.2e-3, 0.0)] * _PROBE_SAMPLES)
    assert tuner.concurrency > 1
    assert tuner.decisions[-1].reason.startswith("fetches wait")


def test_time_queued_for_a_cpu_is_not_waiting():
    # Wall is mostly spent runnable but not running (an oversubscribed machine): more
    # threads would not help.
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=True)
    _probe(tuner, [(8e-3, 1e-3, 6.5e-3)] * _PROBE_SAMPLES)
    assert tuner.concurrency == 1


def test_partly_waiting_samples_start_at_their_overlap():
    # 4 ms wall, 1 ms CPU: about four fetches fit before the CPU is the limit.
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=True)
    _probe(tuner, [(4e-3, 1e-3, 0.0)] * _PROBE_SAMPLES)
    assert tuner.concurrency == 4


def test_global_rng_use_settles_at_one_at_once():
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=True)
    tuner.observe_sample(8e-3, 0.1e-3, touched_rng=True)
    assert tuner.concurrency == 1 and not tuner.exploring
    assert "global RNG" in tuner.decisions[-1].reason


def test_fixed_setting_and_whole_batch_datasets_do_not_explore():
    fixed = ConcurrencyTuner(3, thread_safe=False, can_split=True, threads_promised=True)
    whole = ConcurrencyTuner("auto", thread_safe=False, can_split=False, threads_promised=True)
    assert (fixed.concurrency, fixed.exploring) == (3, False)
    assert (whole.concurrency, whole.exploring) == (1, False)


def test_waiting_samples_stay_at_one_without_the_promise_and_say_what_it_would_give():
    tuner = ConcurrencyTuner("auto", thread_safe=False, can_split=True, threads_promised=False)
    assert not tuner.probing  # no threads: global RNG draws cannot race, nothing to probe
    _probe(tuner, [(8e-3, 0.5e-3, 0.0)] * _PROBE_SAMPLES)
    assert (tuner.concurrency, tuner.exploring) == (1, False)
    assert tuner.unused_gain == 16.0
    assert tuner.decisions[-1].reason == (
        "fetches wait 94% of their time (8.0 ms each), one at a time as in torch: if "
        "__getitem__ is thread-safe (and draws randomness only from stoker.sample_rng()), "
        "worker_concurrency=16 would fetch ~16x faster per worker (estimate from the fetches' "
        "wait/CPU time); stoker_thread_safe = True on the dataset class lets stoker tune it"
    )
