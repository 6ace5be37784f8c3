"""stoker-only engine features: error policy, executors, tuner, determinism, stats, sharding."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
from _engine_datasets import (
    Augmenting,
    Computing,
    Corrupt,
    Dies,
    HeadBlocked,
    HoldsTheGil,
    Stuck,
    Waiting,
    WaitingDeclared,
    WaitingThreadSafe,
    WaitingWithGlobalRng,
)

import stoker

EXECUTORS = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2}, id="process"),
    pytest.param({"worker_type": "thread"}, id="thread"),
]


def _values(batches):
    return sorted(torch.cat(batches).tolist())


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


# -- on_error="skip" ---------------------------------------------------------------------------


@pytest.mark.parametrize("executor", EXECUTORS)
def test_skip_leaves_out_bad_samples_and_counts_them(executor, caplog):
    loader = stoker.DataLoader(Corrupt(), batch_size=4, on_error="skip", skip_budget=4, **executor)
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        batches = list(loader)
        list(loader)  # a second epoch: each bad index is still logged once
    assert _values(batches) == [i for i in range(40) if i not in (5, 6, 7, 8)]
    assert loader.stats().skipped == 8
    # One warning for the loader (as the docs say), each other bad sample once at DEBUG.
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "stoker"]
    assert logged == [
        ("WARNING", "stoker skipped sample 5: OSError: corrupt file 5. Further skipped samples "
                    "are counted in loader.stats().skipped and logged at DEBUG level (logger "
                    "'stoker')."),
    ] + [("DEBUG", f"stoker skipped sample {i}: OSError: corrupt file {i}") for i in (6, 7, 8)]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_skip_budget_exceeded_raises_with_the_errors(executor):
    loader = stoker.DataLoader(Corrupt(), batch_size=4, on_error="skip", skip_budget=3, **executor)
    with pytest.raises(stoker.SkipBudgetExceeded) as info:
        list(loader)
    assert str(info.value) == (
        "on_error='skip' skipped 4 samples this epoch, more than the budget of 3 "
        "(skip_budget=3). First errors: 5: OSError: corrupt file 5; 6: OSError: corrupt file 6; "
        "7: OSError: corrupt file 7; 8: OSError: corrupt file 8. Fix those samples, or raise "
        "skip_budget."
    )


def test_skip_default_fraction_budget_and_raise_default():
    assert stoker.DataLoader(Corrupt(), on_error="skip").skip_budget == 0.01
    with pytest.raises(OSError, match="corrupt file 5"):
        list(stoker.DataLoader(Corrupt(), batch_size=4))


def test_bad_policy_arguments_say_what_to_change():
    iterable = _Stream()
    with pytest.raises(ValueError) as info:
        stoker.DataLoader(iterable, on_error="skip")
    assert str(info.value) == (
        "on_error='skip' needs a map-style dataset: an IterableDataset's iterator usually cannot "
        "continue after it raises (a generator is closed by the exception), so skipping would "
        "silently end its stream. Catch the error inside __iter__ instead."
    )
    with pytest.raises(ValueError) as info:
        stoker.DataLoader(Corrupt(), on_error="ignore")
    assert str(info.value) == "on_error='ignore': expected one of ('raise', 'skip')."
    with pytest.raises(ValueError) as info:
        stoker.DataLoader(Corrupt(), worker_concurrency=0)
    assert str(info.value) == (
        "worker_concurrency=0: expected a number of samples fetched at once per worker "
        "(int >= 1) or 'auto'."
    )
    with pytest.raises(ValueError) as info:
        stoker.DataLoader(iterable, worker_type="thread")
    assert str(info.value).startswith("worker_type='thread' needs a map-style dataset")
    with pytest.raises(ValueError) as info:
        stoker.DataLoader(Corrupt(), shard=True, sampler=range(3))
    assert str(info.value) == (
        "shard=True builds its own sampler (this rank's share of each epoch); remove "
        "sampler=/batch_sampler=, or drop shard=True and pass a DistributedSampler yourself "
        "(a DistributedSampler passed with shard=True, as Lightning injects one, is used in "
        "place of stoker's)."
    )


# -- the concurrency tuner ---------------------------------------------------------------------


def _decisions(loader):
    return [(e.concurrency, e.reason) for e in loader.stats().tuner]


@pytest.mark.parametrize("executor", EXECUTORS[1:])
def test_waiting_fetches_get_concurrency_when_promised(executor):
    loader = stoker.DataLoader(WaitingDeclared(), batch_size=16, **executor)
    batches = list(loader)
    assert sorted(torch.cat(batches)[:, 0].tolist()) == list(range(480))
    first = loader.stats().tuner[0]
    assert first.concurrency > 1 and first.reason.startswith("fetches wait")
    assert max(loader.stats().concurrency) > 1


def test_cpu_bound_fetches_stay_at_one():
    loader = stoker.DataLoader(Computing(), batch_size=16, num_workers=2)
    list(loader)
    assert all(c == 1 for c in loader.stats().concurrency)
    assert all(r.startswith("fetches keep a CPU busy") for _, r in _decisions(loader))


def test_waiting_fetches_stay_at_one_without_the_promise_and_stats_say_what_it_gives():
    loader = stoker.DataLoader(Waiting(160), batch_size=16, num_workers=2)
    list(loader)
    assert loader.stats().concurrency == (1, 1)
    for concurrency, reason in _decisions(loader):
        assert concurrency == 1
        assert re.fullmatch(
            r"fetches wait \d+% of their time \(\d+\.\d ms each\), one at a time as in "
            r"torch: if __getitem__ is thread-safe \(and draws randomness only from "
            r"stoker\.sample_rng\(\)\), worker_concurrency=\d+ would fetch ~\d+x faster per "
            r"worker \(estimate from the fetches' wait/CPU time\); stoker_thread_safe = True on "
            r"the dataset class lets stoker tune it", reason), reason


def test_thread_workers_with_persistent_workers_start_each_pass_anew():
    # persistent_workers kept the first pass's iterator, which has no workers to keep: the
    # second pass raised AttributeError ('ThreadIterator' object has no attribute 'stopped')
    loader = stoker.DataLoader(Waiting(24), batch_size=8, num_workers=2, worker_type="thread",
                               persistent_workers=True)
    def indices(batches: list[torch.Tensor]) -> list[int]:
        return sorted(torch.cat(batches)[:, 0].tolist())

    assert [indices(list(loader)) for _ in range(3)] == [list(range(24))] * 3
    first = iter(loader)
    next(first)
    assert indices([next(first), *iter(loader), next(first)]) == sorted(
        list(range(8, 24)) + list(range(24))
    )  # each pass's iterator its own, as without persistent_workers


def test_global_rng_dataset_is_never_run_concurrently():
    # worker_type="thread" promises thread-safety, yet a global RNG draw seen while exploring
    # keeps fetches at one (their augmentations would depend on thread timing).
    loader = stoker.DataLoader(WaitingWithGlobalRng(120), batch_size=8, worker_type="thread")
    list(loader)
    assert all(c == 1 for c in loader.stats().concurrency)
    assert all("draws from a global RNG" in r for _, r in _decisions(loader))


def test_fixed_concurrency_is_respected():
    loader = stoker.DataLoader(Waiting(64), batch_size=8, num_workers=2, worker_concurrency=3)
    list(loader)
    assert _decisions(loader) == [(3, "set by worker_concurrency")] * 2


@pytest.mark.parametrize("executor", EXECUTORS[1:])
def test_in_order_delivery_survives_out_of_order_completion(executor):
    # Sample 20 finishes only after sample 40 (a later batch) was fetched: six batches must be
    # in flight, which takes ~21 fetches at once. The concurrency is set, not tuned: the
    # tuner's choice follows the load (30-64 measured), and at 16 sample 20 waited out BLOCK_S
    # (a stress run's failure).
    loader = stoker.DataLoader(HeadBlocked(), batch_size=4, timeout=60, worker_concurrency=32,
                               **executor)
    assert torch.cat(list(loader)).tolist() == list(range(64))


# -- determinism -------------------------------------------------------------------------------


def _run(dataset, **kwargs):
    """Per-batch seeding (beyond torch): the draws do not depend on the executor."""
    gen = torch.Generator().manual_seed(11)
    return list(stoker.DataLoader(dataset, batch_size=4, shuffle=True, generator=gen,
                                  seeding="per_batch", **kwargs))


@pytest.mark.parametrize("executor", EXECUTORS[1:] + [pytest.param({"num_workers": 1}, id="1")])
def test_global_rng_augmentations_do_not_depend_on_the_executor(executor):
    reference, other = _run(Augmenting()), _run(Augmenting(), **executor)
    assert all(torch.equal(a, b) for a, b in zip(reference, other, strict=True))


def test_in_order_false_gives_the_same_batches_reordered():
    reference = {tuple(b[:, 0].tolist()): b for b in _run(Augmenting())}
    for batch in _run(Augmenting(), num_workers=2, in_order=False):
        assert torch.equal(reference[tuple(batch[:, 0].tolist())], batch)


def test_sample_rng_is_the_same_under_concurrency_and_any_executor():
    runs = [_run(WaitingThreadSafe(96), **e.values[0]) for e in EXECUTORS]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))


def test_sample_rng_outside_a_loader_says_what_to_do():
    with pytest.raises(RuntimeError) as info:
        stoker.sample_rng()
    assert str(info.value) == (
        "stoker.sample_seed()/sample_rng()/sample_generator() only work while a stoker "
        "DataLoader is loading a sample (inside Dataset.__getitem__). Outside a loader, create "
        "your own generator, e.g. numpy.random.default_rng(seed)."
    )


# -- dead and stuck workers --------------------------------------------------------------------


def test_killed_worker_is_named_with_signal_and_samples():
    with pytest.raises(stoker.WorkerDiedError) as info:
        list(stoker.DataLoader(Dies("SIGKILL"), batch_size=4, num_workers=2))
    text = str(info.value)
    assert re.match(r"DataLoader worker \(pid \d+\) is killed by signal: Killed\. ", text)
    assert "It was worker 0 (SIGKILL), loading sample indices [8, 9, 10, 11" in text
    assert "out-of-memory killer" in text
    assert text.endswith("The epoch stops here instead of silently ending short.")


def test_native_crash_shows_the_workers_faulthandler_stack():
    with pytest.raises(stoker.WorkerDiedError) as info:
        list(stoker.DataLoader(Dies("SIGSEGV"), batch_size=4, num_workers=2))
    text = str(info.value)
    # torch's own test_segfault looks for this sentence.
    assert re.match(r"DataLoader worker \(pid \d+\) is killed by signal: Segmentation fault",
                    text)
    assert "(SIGSEGV)" in text and "The worker's faulthandler output:" in text
    assert "in __getitem__" in text  # the crashing Python frame


_CRASH_SCRIPT = """
import stoker
from _engine_datasets import Dies
try:
    list(stoker.DataLoader(Dies("SIGSEGV"), batch_size=4, num_workers=2))
except stoker.WorkerDiedError as exc:
    print(exc)
"""


@pytest.mark.parametrize("faulthandler_on", [False, True])
def test_a_crash_report_has_the_stack_where_faulthandler_was_on(faulthandler_on):
    # A fresh interpreter (pytest turns faulthandler on in its own): off, as in a plain
    # script, the worker leaves it off as torch's does and the report says how to get the
    # stack; on, the report quotes it (NOTE [ faulthandler as the parent left it ]).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    if faulthandler_on:
        env["PYTHONFAULTHANDLER"] = "1"
    done = subprocess.run([sys.executable, "-c", _CRASH_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent, check=True)
    out = done.stdout
    assert re.match(r"DataLoader worker \(pid \d+\) is killed by signal: Segmentation fault",
                    out)
    # on stderr too, as torch's worker writes it there (a program that catches the error
    # sees it), found by a sweep
    on_stderr = "Fatal Python error: Segmentation fault" in done.stderr
    assert on_stderr == faulthandler_on, done.stderr
    if faulthandler_on:
        assert "The worker's faulthandler output:" in out and "in __getitem__" in out
        assert "in __getitem__" in done.stderr
    else:
        assert "The worker's faulthandler output:" not in out
        assert ("For the worker's Python stack in this report, run with faulthandler on "
                "(`python -X faulthandler`, or PYTHONFAULTHANDLER=1).") in out


def test_persistent_worker_killed_between_epochs_is_reported_at_the_next_epoch():
    # The next epoch's first message to it meets a closed socket (EPIPE): that is its death.
    loader = stoker.DataLoader(Computing(), batch_size=40, num_workers=2,
                               persistent_workers=True, worker_type="process")
    assert len(list(loader)) == 6
    worker = loader._iterator._group.workers[1]
    os.kill(worker.pid, signal.SIGKILL)
    worker.process.join(10)
    assert worker.process.exitcode == -signal.SIGKILL
    with pytest.raises(stoker.WorkerDiedError,
                       match=r"is killed by signal: Killed\. It was worker 1 \(SIGKILL\)"):
        list(loader)
    first = next(iter(loader))  # the next epoch starts fresh workers
    assert torch.equal(first, torch.stack([Computing()[i] for i in range(40)]))


def test_worker_exit_code_is_reported():
    with pytest.raises(stoker.WorkerDiedError,
                       match=r"exited unexpectedly with code 3\. It was worker \d, loading"):
        list(stoker.DataLoader(Dies("exit"), batch_size=4, num_workers=2))


class _Told(logging.Handler):
    """Keeps the records of one logger and sets ``seen`` at the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.seen.set()


def test_stall_report_names_the_worker_samples_and_stack():
    # A WARNING record on stoker's logger, not a warnings warning (issue 44): the run goes on
    # and succeeds, and torch says nothing there.
    event = multiprocessing.get_context("fork").Event()
    loader = stoker.DataLoader(Stuck(event), batch_size=2, num_workers=2, stall_warning_s=0.3)
    told = _Told()
    logger = logging.getLogger("stoker.engine.worker_group")
    logger.addHandler(told)

    def release_when_told():
        told.seen.wait(timeout=30)
        event.set()

    helper = threading.Thread(target=release_when_told)
    helper.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            batches = list(loader)
    finally:
        event.set()
        helper.join(timeout=60)
        logger.removeHandler(told)
    assert torch.cat(batches).tolist() == list(range(8))
    stall = [r for r in told.records if "no batch for" in r.getMessage()]
    assert stall, "no stall report"
    assert (stall[0].levelno, getattr(stall[0], "category", None)) == (
        logging.WARNING, stoker.StallWarning)
    text = stall[0].getMessage()
    assert "holds sample indices [2, 3" in text and "in __getitem__" in text
    # asked through the parent watch, whose own frame is left out (NOTE [ Stacks on request ])
    assert "_watch_parent" not in text and "Current thread" not in text


def test_stall_report_says_when_a_worker_holding_the_gil_gives_no_stack(tmp_path):
    # No signal handler in a worker (NOTE [ Stacks on request ]): a worker stuck in native code
    # that keeps the GIL cannot answer, and the report says so instead of showing nothing.
    entered, release = str(tmp_path / "entered"), str(tmp_path / "release")
    os.mkfifo(entered)
    os.mkfifo(release)
    loader = stoker.DataLoader(HoldsTheGil(entered, release), batch_size=2, num_workers=2,
                               stall_warning_s=0.3)
    told = _Told()
    no_stack = threading.Event()
    told.emit = lambda record: (told.records.append(record),  # type: ignore[method-assign]
                                "did not come" in record.getMessage() and no_stack.set())
    logger = logging.getLogger("stoker.engine.worker_group")
    logger.addHandler(told)

    def release_when_told():
        no_stack.wait(timeout=120)  # on a stack instead, the assertions below say so
        fd = os.open(release, os.O_WRONLY)  # the shell reads it: sample 3 is under way
        os.write(fd, b"go\n")
        os.close(fd)

    helper = threading.Thread(target=release_when_told)
    helper.start()
    try:
        batches = list(loader)
    finally:
        no_stack.set()
        helper.join(timeout=60)
        logger.removeHandler(told)
    assert torch.cat(batches).tolist() == list(range(8))
    stalls = [r.getMessage() for r in told.records if "no batch for" in r.getMessage()]
    # the last report came after worker 0's batches, while worker 1's shell ran
    assert stalls and "holds sample indices [2, 3" in stalls[-1]
    assert "its stack did not come within 1 s (native code holding the GIL?)" in stalls[-1]


# -- stats -------------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", EXECUTORS)
def test_stats_count_batches_and_samples(executor):
    loader = stoker.DataLoader(Waiting(40), batch_size=8, **executor)
    assert loader.stats().summary == "stoker: no batches yet."
    list(loader)
    stats = loader.stats()
    assert (stats.batches, stats.samples) == (5, 40)
    assert stats.summary.startswith("stoker: 5 batches, ") and str(stats) == stats.summary
    assert stats.fetch_wall_s > 0


class _Busy(torch.utils.data.Dataset):
    """About a millisecond of pure-Python CPU work per sample."""

    def __len__(self):
        return 480

    def __getitem__(self, i):
        total = 0
        for k in range(20000):
            total += k ^ i
        return total


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat")
@pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes")
def test_stats_tell_waiting_for_a_cpu_from_waiting_for_io():
    # Two CPU-bound workers confined to one CPU (children inherit the affinity): each fetch
    # spends about half its wall time queued, which is neither I/O nor idle.
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})
    try:
        loader = stoker.DataLoader(_Busy(), batch_size=16, num_workers=2, timeout=120,
                                   worker_type="process")
        assert len(list(loader)) == 30
    finally:
        os.sched_setaffinity(0, saved)
    stats = loader.stats()
    assert stats.fetch_queued_s > 0.2 * stats.fetch_wall_s, stats
    assert "for a CPU" in stats.summary and "I/O" not in stats.summary, stats.summary


# -- sharding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("even", ["pad", "drop", "exact"])
def test_shard_splits_ranks_evenly(monkeypatch, even):
    dataset = torch.utils.data.TensorDataset(torch.arange(25))  # shares 9, 8, 8
    per_rank = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        loader = stoker.DataLoader(dataset, batch_size=4, shuffle=True, shard=True,
                                   shard_even=even, generator=torch.Generator().manual_seed(5))
        per_rank.append(list(loader))
        assert len(loader) == len(per_rank[-1])
    assert len({len(r) for r in per_rank}) == 1  # every rank takes the same number of steps
    read = [i for r in per_rank for b in r if not isinstance(b, stoker.EndOfData)
            for i in b[0].tolist()]
    if even == "exact":  # 3, 2, 2 real batches; the short ranks step once more on EndOfData
        assert sorted(read) == list(range(25))
        assert sum(isinstance(b, stoker.EndOfData) for r in per_rank for b in r) == 2
    elif even == "pad":
        assert set(read) == set(range(25)) and len(read) == 27
    else:
        assert len(read) == len(set(read)) == 24
