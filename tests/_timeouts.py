"""Per-test time limits that fail one test and let the run go on to its counts.

NOTE [ A timeout fails one test, the run goes on ]
pytest-timeout's ``thread`` method ends a hung test by ending the whole pytest process
(``os._exit``): on a busy machine one slow test then cost every later test and the run printed
no counts (issue 47). Its ``signal`` method raises in the main thread instead, but it raises
``pytest.fail``'s ``Failed``, which Hypothesis catches as a test failure and then shrinks by
re-running examples for minutes, with no timer left. So this module installs pytest-timeout's
timer itself (the ``pytest_timeout_set_timer`` hook, first result wins), the same
``SIGALRM``/``setitimer`` as the ``signal`` method, whose handler dumps every thread's stack and
raises ``TestTimedOut``: a ``BaseException`` (as ``KeyboardInterrupt`` is), so neither
Hypothesis nor a loader's ``except Exception`` swallows it. pytest reports that one test as
failed and runs the next.

What a signal cannot interrupt (a main thread stuck in C code that never returns to Python, or
a test whose own code cancelled the timer with ``signal.alarm(0)``) is caught by the backstop:
one daemon thread, started before the first test (so every leak check's baseline has it), that
``BACKSTOP_SLACK_S`` (or the test's limit, if longer) after a test's limit writes every
thread's stack and the counts so far (passed, failed, ..., and how many tests never ran) and
ends the process. A run therefore ends with counts in every case.

Forked workers inherit the ``SIGALRM`` handler but not the timer (``setitimer`` timers are not
inherited across ``fork``), so a worker never gets the alarm; torch's and stoker's workers
inherit the same handler, so comparisons of the two see the same dispositions.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# After a test's limit: its failure's cleanup, Hypothesis' last replay. (The environment
# variable is for tests/integration/test_suite_timeouts.py, which checks the backstop.)
BACKSTOP_SLACK_S = float(os.environ.get("STOKER_TEST_BACKSTOP_SLACK_S", 180.0))


class TestTimedOut(BaseException):  # noqa: N818 (named for what a reader of a failure sees)
    """A test ran past its per-test limit (pytest-timeout's ``timeout``, or its marker)."""

    __test__ = False  # not a test class, whatever its name


RETRY_S = 0.1
_phase = [False]  # whether a test's setup, call or teardown is running (see in_phase)


@contextmanager
def in_phase() -> Iterator[None]:
    """Around a test's setup, call or teardown (the root conftest's hook wrappers): where
    pytest turns an exception into that test's failure. Between them (making reports, logging)
    an exception is pytest's INTERNALERROR, which ends the run, so the alarm waits for the
    next phase."""
    _phase[0] = True
    try:
        yield
    finally:
        _phase[0] = False


def _terminal(config: pytest.Config) -> Any:
    return config.get_terminal_writer()


def _stacks(skip_caller: bool) -> str:
    """Every thread's Python stack (but the caller's, if ``skip_caller``), named."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        if skip_caller and ident == me:
            continue
        parts.append(f"--- stack of {names.get(ident, '<unknown>')} ({ident}):\n"
                     + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def _item_timeout(item: pytest.Item) -> float:
    try:
        from pytest_timeout import _get_item_settings
    except ImportError:  # pragma: no cover - pytest-timeout is a test dependency
        return 0.0
    return float(_get_item_settings(item).timeout or 0.0)


def set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """``pytest_timeout_set_timer``: the ``signal`` method, raising ``TestTimedOut``."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own implementation

    def on_alarm(signum: int, frame: Any) -> None:
        from pytest_timeout import is_debugging

        if not settings.disable_debugger_detection and is_debugging():
            return
        if not _phase[0]:  # in pytest's own code between phases: raised there, it would end
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)  # the run; the next phase gets it
            return
        __tracebackhide__ = True
        writer = _terminal(item.config)
        writer.sep("+", title=f"Timeout: {item.nodeid}")
        writer.write(_stacks(skip_caller=False) + "\n")  # the main thread's: where it hung
        writer.sep("+", title="Timeout")
        raise TestTimedOut(
            f"{item.nodeid} ran past its {settings.timeout:g} s limit (pytest-timeout, "
            f"signal method): every thread's stack is above; this test failed and the run "
            f"goes on"
        )

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  (pytest-timeout's cancel hook)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


class Backstop:
    """The thread that ends a run a signal could not unstick (see the NOTE above)."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._cond = threading.Condition()
        self._armed: tuple[str, float, float] | None = None  # nodeid, limit, deadline
        self._thread = threading.Thread(target=self._watch, name="stoker-test-backstop",
                                        daemon=True)
        self._thread.start()

    def arm(self, item: pytest.Item) -> None:
        limit = _item_timeout(item)
        with self._cond:
            if limit > 0:
                slack = max(BACKSTOP_SLACK_S, min(limit, 600.0))
                self._armed = (item.nodeid, limit, time.monotonic() + limit + slack)
            else:
                self._armed = None
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._armed = None
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._armed is None:
                    self._cond.wait()
                    continue
                left = self._armed[2] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._end_run(*self._armed[:2])

    def _end_run(self, nodeid: str, limit: float) -> None:
        config = self._config
        try:
            capman = config.pluginmanager.getplugin("capturemanager")
            if capman is not None:
                capman.suspend_global_capture(in_=True)
            reporter = config.pluginmanager.getplugin("terminalreporter")
            stats = getattr(reporter, "stats", {})
            counts = {k: len(v) for k, v in stats.items() if k and k != "warnings"}
            collected = getattr(reporter, "_numcollected", 0)
            done = sum(counts.get(k, 0) for k in ("passed", "failed", "skipped", "xfailed",
                                                   "xpassed"))
            writer = _terminal(config)
            writer.sep("!", title="backstop: ending the run")
            writer.write(_stacks(skip_caller=True) + "\n")
            writer.sep("!", title="backstop")
            summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing"
            writer.write(
                f"{nodeid} was still running {BACKSTOP_SLACK_S:g}+ s after its {limit:g} s "
                f"limit: the timeout's signal did not stop it (stuck outside Python, or the "
                f"test cancelled SIGALRM); its threads' stacks are above.\n"
                f"counts so far: {summary}; about {max(0, collected - done)} of {collected} "
                f"collected tests did not run\n"
            )
            writer.flush()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)


BACKSTOP_KEY = pytest.StashKey[Backstop]()


def start_backstop(config: pytest.Config) -> None:
    if sys.platform.startswith("linux") and BACKSTOP_KEY not in config.stash:
        config.stash[BACKSTOP_KEY] = Backstop(config)


def backstop(config: pytest.Config) -> Backstop | None:
    return config.stash.get(BACKSTOP_KEY, None)

