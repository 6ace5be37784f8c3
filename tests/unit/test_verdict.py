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
    assert "fetches wait 90% of their time (I/O" in text and "8 concurrent" in text


def test_waiting_for_a_cpu_is_not_io():
    # 4 CPU-bound workers on 2 cores: each fetch runs half its wall time and queues the rest.
    text = summarize(_stats(num_workers=4, fetch_wall_s=10.0, fetch_cpu_s=5.0,
                            fetch_queued_s=4.8))
    assert "I/O" not in text
    assert "wait 48% of their time for a CPU" in text and "num_workers <= " in text


def test_hypervisor_steal_is_not_io():
    # CPU-bound fetches on a VM whose host ran other guests 40% of the time.
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=6.0, collate_s=0.1,
                            cpu_steal_share=0.4))
    assert "I/O" not in text
    assert "CPU-bound" in text and "40% of this machine's CPU time to other guests" in text


def test_without_steal_or_queueing_the_same_fetches_read_as_waiting():
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=3.0))
    assert "fetches wait 70% of their time (I/O" in text


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (dict(num_workers=0, fetch_wall_s=9, fetch_cpu_s=9), "num_workers=0"),
        (dict(inline=True, fetch_wall_s=9, fetch_cpu_s=9), "array gathers"),
        (dict(fetch_wall_s=2, fetch_cpu_s=2, collate_s=6), "collating"),
        (dict(fetch_wall_s=9, fetch_cpu_s=9, unpack_s=4), "receiving batches"),
    ],
)
def test_other_causes(kw, expected):
    assert expected in summarize(_stats(**kw))


def test_waiting_fetches_at_one_say_what_promising_thread_safety_would_give():
    text = summarize(_stats(fetch_wall_s=10.0, fetch_cpu_s=1.0, concurrency=(1, 1)))
    assert text.endswith(
        "Input-bound: fetches wait 90% of their time (I/O or remote storage), one at a time "
        "per worker as in torch; raise num_workers, or if __getitem__ is thread-safe (and "
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
        "Input-bound: batches are loaded on 2 threads of the training process "
        "(worker_type='thread'), which fetched on a CPU 25% of the loop's time and collate in "
        "the loop's own thread; their Python code shares one GIL with the loop, so they cannot "
        "use more than one core: use worker_type='process' for CPU-bound datasets "
        "(decode/augment)."
    )
    assert "CPU-bound (busy" not in summarize(_stats(threads=True))
    # A thread waiting for the GIL is not doing I/O: at one fetch at a time the tuner found
    # nothing to overlap, so the wait is not read as I/O ...
    gil = summarize(_stats(threads=True, fetch_wall_s=10.0, fetch_cpu_s=1.0, concurrency=(1,)))
    assert "worker_type='thread'" in gil and "I/O" not in gil
    # ... while fetches the tuner overlapped (they truly wait) are I/O-bound.
    io = summarize(_stats(threads=True, fetch_wall_s=10.0, fetch_cpu_s=1.0, concurrency=(8,)))
    assert "fetches wait 90% of their time (I/O" in io
