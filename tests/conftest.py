"""Shared fixtures for every test directory.

``STOKER_TEST_LOADER`` picks the loader class under test:

* ``stoker`` (default): ``stoker.DataLoader``;
* ``torch``: ``torch.utils.data.DataLoader``. Run the suite this way to check the tests
  themselves: every test that states torch-compatible behaviour must pass against torch.
  Tests of stoker-only behaviour (where stoker deliberately does better than torch) are
  skipped in this mode via the ``stoker_only`` fixture.

Also here, for every directory: the per-test timeout that fails one test and lets the run go
on (``_timeouts``, NOTE [ A timeout fails one test, the run goes on ]); the fast tier's marker
(``_tiers``: ``scripts/test.sh --fast``); and the end-of-run list of generated-example tests
that a time budget stopped early (``_budget``); and the collected objects frozen out of the
collector's walks (``_collected_frozen``); and, before each file's first test, the heap backed
by huge pages so that each fork copies fewer page-table entries (``_huge_pages``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.utils.data

import _budget
import _collected_frozen
import _huge_pages
import _tiers
import _timeouts
import _xdist_order

# A suite started in the background (``cmd &`` in a non-interactive shell, as a script or a CI
# step may do) begins with SIGINT ignored, and every process it starts inherits that: the
# tests that press Ctrl-C on a child (tests/integration/test_shutdown.py, the doctor's) would
# wait for a child that cannot hear it. Start from a terminal's state: Python's own handler,
# which a child gets back as the default disposition when it starts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

LOADER_ENV = "STOKER_TEST_LOADER"
_CHOICES = ("stoker", "torch")


def loader_choice() -> str:
    """The value of ``STOKER_TEST_LOADER`` (``stoker`` when unset)."""
    choice = os.environ.get(LOADER_ENV, "stoker").strip().lower() or "stoker"
    if choice not in _CHOICES:
        raise pytest.UsageError(f"{LOADER_ENV}={choice!r}: expected one of {_CHOICES}")
    return choice


@pytest.fixture(scope="session")
def loader_name() -> str:
    return loader_choice()


@pytest.fixture(scope="session")
def Loader(loader_name: str) -> type:
    """The DataLoader class under test."""
    if loader_name == "torch":
        return torch.utils.data.DataLoader
    try:
        from stoker import DataLoader
    except Exception as exc:  # ImportError, or a broken module while stoker is being written
        pytest.fail(
            f"cannot import stoker.DataLoader ({type(exc).__name__}: {exc}); "
            f"set {LOADER_ENV}=torch to check the tests against torch",
            pytrace=False,
        )
    return DataLoader


@pytest.fixture(scope="session")
def TorchLoader() -> type:
    """torch's DataLoader, the reference the loader under test is compared with."""
    return torch.utils.data.DataLoader


@pytest.fixture
def stoker_only(loader_name: str) -> None:
    """Skip a test of stoker-specific behaviour (torch does something worse there)."""
    if loader_name != "stoker":
        pytest.skip("stoker-specific behaviour; torch differs here on purpose")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator:
    """Expose each phase's report as ``item.stoker_report_<phase>`` (setup, call, teardown).

    Fixtures read ``request.node.stoker_report_call`` in their teardown, e.g. to skip a leak
    check after a failed test whose traceback still holds the loader alive.
    """
    report = yield
    setattr(item, f"stoker_report_{report.when}", report)
    return report


# -- the run: timeouts, the fast tier, example budgets ------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    _timeouts.start_backstop(config)  # before any test: part of every leak check's baseline
    _xdist_order.keep_collection_order(config)  # xdist would sort files by their test counts


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's ``signal`` method, raising ``_timeouts.TestTimedOut``."""
    return _timeouts.set_timer(item, settings)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator:
    # the first file's: what collection left; each later one's: what the last file's tests grew
    _huge_pages.collapse_on_new_file(item.path)
    backstop = _timeouts.backstop(item.config)
    if backstop is not None:
        backstop.arm(item)
    try:
        return (yield)
    finally:
        if backstop is not None:
            backstop.disarm()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator:
    with _timeouts.in_phase():
        return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator:
    with _timeouts.in_phase():
        return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator:
    with _timeouts.in_phase():
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _tiers.mark_fast(config, items)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # several pytest processes: longest files first
        _xdist_order.heaviest_first(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    _collected_frozen.freeze_collected()


@pytest.fixture(scope="session")
def fast_tier(pytestconfig: pytest.Config) -> bool:
    """Whether this run is the fast tier (``tests/_tiers.py``): budgets shrink to fit it."""
    return _tiers.fast_requested(pytestconfig)


@pytest.fixture
def example_budget(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """``example_budget(name, max_examples, seconds)``: this test's ``_budget.ExampleBudget``
    (the same one on every call, so each Hypothesis example shares it), reported at the end."""
    made: list[_budget.ExampleBudget] = []

    def get(name: str, max_examples: int, seconds: float) -> _budget.ExampleBudget:
        if not made:
            made.append(_budget.ExampleBudget(name, max_examples, seconds))
        return made[0]

    yield get
    for budget in made:
        budget.report(request.node)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    reports = [r for rs in terminalreporter.stats.values() for r in rs]
    lines = list(dict.fromkeys(_budget.summary_lines(reports)))
    if lines:
        terminalreporter.section("example budgets")
        for line in lines:
            terminalreporter.line(line)
