"""The one-line verdict of ``loader.stats()``: which stage holds the loop back, from figures."""

from __future__ import annotations

import pytest

from stoker._core.stats import LoaderStats
from stoker.profile.verdict import summarize


def _stats(**kw) -> LoaderStats:
    base = dict(batches=100, samples=6400, num_workers=2, wait_s=9.0, loop_s=1.0,
                concurrency=(1, 1))
    base.update(kw)
    return LoaderStats(**base)


def test_a_loop_that_rarely_waits_is_not_input_bound():
    text = summarize(_stats(wait_s=0.5, loop_s=9.5, fetch_wall_s=5, fetch_cpu_s=5))
    assert "Not input-bound" in text and "waited for data 5% of the time" in text


def test_fetches_that_wait_off_cpu_are_io_bound():
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=1.0, concurrency=(8, 8)))
    assert text.endswith(
        "Input-bound: the workers are blocked off a CPU 90% of their time (I/O, remote storage "
        "or sleeps in __getitem__), at up to 8 concurrent fetches; 0% waiting for a CPU; raise "
        "num_workers (num_workers=4) or worker_concurrency, or move the data closer.")


def test_waiting_for_a_cpu_is_not_io():
    # 4 CPU-bound workers on 2 cores: each fetch runs half its wall time and queues the rest.
    text = summarize(_stats(num_workers=4, fetch_wall_s=10.0, fetch_cpu_s=5.0,
                            fetch_queued_s=4.8, queue_measured=True))
    assert "I/O" not in text
    assert text.endswith(
        "Input-bound: the workers wait 48% of their time for a CPU: 4 fetches want to run at "
        "once on the machine's 2 cores; use num_workers=2, or make __getitem__ cheaper.")


def test_waiting_for_a_cpu_held_by_others_is_too_busy_to_tell():
    # The case: the calling thread loads an in-memory dataset on a loaded machine.
    text = summarize(_stats(num_workers=0, concurrency=(), fetch_wall_s=7.0, fetch_cpu_s=1.5,
                            main_cpu_s=2.0, main_queued_s=6.8, queue_measured=True))
    assert "I/O" not in text and "worker_concurrency" not in text
    assert text.endswith(
        "Input-bound: the training thread's next() calls wait 76% of their time for a CPU (CPU "
        "contention: the 2 cores were held by other processes, or by the training thread "
        "beside 1 fetch(es) of ours); the machine is too busy to tell what the loader needs; "
        "run again when other processes leave the CPUs free; no loader setting can be judged "
        "meanwhile.")


def test_hypervisor_steal_is_not_io():
    # CPU-bound fetches on a VM whose host ran other guests 40% of the time.
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=6.0, collate_s=0.1,
                            cpu_steal_share=0.4))
    assert "I/O" not in text
    assert "CPU work in __getitem__" in text
    assert "40% of this machine's CPU time to other guests" in text


def test_without_steal_or_queueing_the_same_fetches_read_as_waiting():
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=3.0))
    assert "the workers are blocked off a CPU 70% of their time (I/O" in text


def test_two_workers_on_two_cores_are_not_told_to_use_two():
    text = summarize(_stats(fetch_wall_s=9.0, fetch_cpu_s=9.0))
    assert "num_workers=2" not in text and "num_workers <= 2" not in text
    assert text.endswith("make __getitem__ cheaper (faster decoding, smaller images): the 2 "
                         "workers already use the machine's 2 cores.")


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (dict(num_workers=0, fetch_wall_s=9, fetch_cpu_s=9), "num_workers=0"),
        (dict(inline=True, fetch_wall_s=9, fetch_cpu_s=9), "array gathers"),
        (dict(fetch_wall_s=2, fetch_cpu_s=2, collate_s=6), "collating"),
        (dict(fetch_wall_s=9, fetch_cpu_s=9, unpack_s=4), "from the workers to the main"),
    ],
)
def test_other_causes(kw, expected):
    assert expected in summarize(_stats(**kw))


def test_waiting_fetches_at_one_say_what_promising_thread_safety_would_give():
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=1.0, concurrency=(1, 1)))
    assert text.endswith(
        "Input-bound: the workers are blocked off a CPU 90% of their time (I/O, remote storage "
        "or sleeps in __getitem__), one at a time per worker as in torch; 0% waiting for a "
        "CPU; raise num_workers (num_workers=4), or if __getitem__ is thread-safe (and "
        "draws randomness only from stoker.sample_rng()), worker_concurrency=10 would fetch "
        "~10x faster per worker (estimate from the fetches' wait/CPU time); "
        "stoker_thread_safe = True on the dataset class lets stoker tune it."
    )


def test_fetch_threads_are_not_called_cpu_bound_workers():
    # worker_type="thread" used to read "the 2 workers are CPU-bound (busy 0%)": the threads'
    # time was divided among num_workers cores they cannot use (one GIL).
    text = summarize(_stats(threads=True, fetch_wall_s=2.5, fetch_cpu_s=2.5))
    assert text == (
        "stoker: 100 batches, 640 samples/s; the loop waited for data 90% of the time. "
        "Input-bound: batches are loaded on threads of the training process "
        "(worker_type='thread'), on a CPU 25% of the loop's time; their Python code shares one "
        "GIL with the loop, so they cannot use more than one core; use processes: "
        "worker_type=\"process\", num_workers=2."
    )
    assert "CPU-bound (busy" not in summarize(_stats(threads=True))
    # Fetch threads off a CPU while their process keeps a core busy wait for each other (the
    # GIL), not for storage ...
    gil = summarize(_stats(threads=True, fetch_wall_s=20.0, fetch_cpu_s=8.0, concurrency=(2,)))
    assert "wait for the GIL" in gil and "I/O" not in gil
    # ... while threads off a CPU in a process that is mostly idle truly wait.
    io = summarize(_stats(threads=True, fetch_wall_s=10.0, fetch_cpu_s=1.0, concurrency=(8,)))
    assert "the fetch threads are blocked off a CPU 90% of their time (I/O" in io
