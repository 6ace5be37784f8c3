"""The verdict under a real CPU hog (processes spinning on every core, started and stopped
here): an in-memory dataset is not called I/O-bound, and a dataset whose ``__getitem__``
really sleeps (its behaviour, not the test's timing) still is. Both stats() and the doctor's
diagnosis judge with the same rule table (profile/rules.py)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import stoker
from stoker.doctor.diagnose import Setup, diagnose

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                                reason="needs Linux /proc schedstat to tell a CPU queue")
CORES = len(os.sched_getaffinity(0))


_SPIN = "import sys\nprint('spinning', flush=True)\nwhile True: pass\n"


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """Three spinning processes per core: a thread of ours gets a CPU ~2/7 of the time. Each
    says when it spins: on a loaded machine an interpreter takes seconds to start, and a
    measurement made before the hog runs would see no queue."""
    hogs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE)
            for _ in range(3 * CORES)]
    try:
        for p in hogs:
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], 60)
            assert ready and p.stdout.readline() == b"spinning\n", "a CPU hog did not start"
        yield
    finally:
        for p in hogs:
            p.kill()
        for p in hogs:
            p.wait(timeout=30)


class _Sleeps(torch.utils.data.Dataset):
    """A remote read, as the dataset does it: 50 ms off the CPU per sample. Each wake-up then
    waits for a CPU behind the hog (and whatever else the machine runs: a fresh clone's suite
    has run beside a soak at load 7): a few ms per wake-up, a small share of 50 ms, so the read
    dominates at any load a test machine sees (with 5 ms reads, a run at load 7 measured 48%
    of the fetch time queued and rightly called the machine too busy to judge)."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.05)
        return torch.full((4,), float(i))


def _in_memory() -> torch.utils.data.Dataset:
    return torch.utils.data.TensorDataset(torch.randn(50_000, 16), torch.arange(50_000))


def _stats(dataset: torch.utils.data.Dataset, batches: int, num_workers: int) -> Any:
    timeout = 120 if num_workers else 0
    loader = stoker.DataLoader(dataset, batch_size=8, num_workers=num_workers, timeout=timeout)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    del it
    return loader.stats()


def _kind(stats: Any, num_workers: int) -> str:
    setup = Setup(num_workers, "process" if num_workers else "auto", CORES)
    return diagnose(stats, setup).kind


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_in_memory_dataset_under_a_cpu_hog_is_not_io_bound(cpu_hog, num_workers) -> None:
    stats = _stats(_in_memory(), 2000 if num_workers == 0 else 400, num_workers=num_workers)
    assert stats.queue_measured, stats
    assert "I/O" not in stats.summary and "worker_concurrency" not in stats.summary, stats
    assert "for a CPU" in stats.summary, stats.summary
    assert _kind(stats, num_workers) in ("contention", "oversubscribed"), stats.summary


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sleeping_dataset_under_the_same_hog_is_still_io_bound(cpu_hog, num_workers) -> None:
    stats = _stats(_Sleeps(), 10, num_workers=num_workers)
    assert stats.queue_measured, stats
    assert "(I/O, remote storage or sleeps in __getitem__)" in stats.summary, stats.summary
    assert _kind(stats, num_workers) == "storage", stats.summary
