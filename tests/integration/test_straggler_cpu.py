"""StragglerWatch reads a real worker's CPU time (NOTE [ Only stragglers move ]): a computing
process is a straggler, one waiting without CPU keeps its tasks until a second has passed."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from stoker.engine.stragglers import StragglerWatch, thread_cpu_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@contextlib.contextmanager
def _child(code: str) -> Iterator[int]:
    """The pid of a Python child running ``code``, killed and reaped afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def spinning() -> Iterator[int]:
    with _child("while True: pass") as pid:
        yield pid


@pytest.fixture
def waiting() -> Iterator[int]:
    with _child("import sys; sys.stdin.read()") as pid:
        yield pid


def _cpu_advanced(pid: int, by_s: float) -> None:
    start = thread_cpu_s(pid)
    assert start is not None
    deadline = time.monotonic() + 30
    while (thread_cpu_s(pid) or 0.0) - start < by_s:
        assert time.monotonic() < deadline, "the spinning child got no CPU in 30 s"


def test_a_computing_worker_is_a_straggler(spinning):
    watch = StragglerWatch(1)
    watch.started(0, 0.0)
    assert not watch.straggling(0, spinning, 0.05)  # first CPU sample
    assert watch.due(0) == pytest.approx(0.07)  # the next one a window later
    _cpu_advanced(spinning, 0.015)
    assert watch.straggling(0, spinning, 0.07)


def test_a_worker_without_cpu_keeps_its_tasks_until_a_second(waiting):
    watch = StragglerWatch(1)
    watch.started(0, 0.0)
    assert not watch.straggling(0, waiting, 0.05)
    assert not watch.straggling(0, waiting, 0.3)  # paused or waiting: no CPU used
    assert watch.straggling(0, waiting, 1.0)  # waiting that long on I/O is a straggler too
