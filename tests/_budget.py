"""Generated-example tests bounded by examples AND time: ``ExampleBudget``.

A Hypothesis test runs ``max_examples`` examples however long each takes; on a busy machine a
bounded run meant to take three minutes took twenty and hit its per-test timeout (issue 47).
With a budget, the test body checks examples until ``max_examples`` or until ``seconds`` are
spent; after that, the examples Hypothesis still generates are counted and not run (generating
one costs milliseconds), and the test passes having checked fewer. How many it checked is
recorded on the test (``user_properties``) and listed at the end of the run by the root
conftest's terminal summary ("example budgets"), so a run stopped by its budget says so.

A failure turns the budget off: Hypothesis shrinks and replays the failing example in full
(a budget that skipped the replays would hide the failure as a flaky one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

PROPERTY = "example_budget"


class ExampleBudget:
    """Checks examples until ``max_examples`` or ``seconds``; ``report()`` says how many."""

    def __init__(self, name: str, max_examples: int, seconds: float) -> None:
        self.name, self.max_examples, self.seconds = name, max_examples, seconds
        self.start = time.monotonic()
        self.checked = 0
        self.not_run = 0
        self.failed = False

    def spent(self) -> bool:
        return not self.failed and time.monotonic() - self.start >= self.seconds

    def run(self, check: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``check(*args, **kwargs)``, unless the budget is spent (then counted, not run)."""
        if self.spent():
            self.not_run += 1
            return
        self.checked += 1
        try:
            check(*args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    def line(self) -> str:
        took = time.monotonic() - self.start
        why = ("the time budget ran out: the rest were generated, not run" if self.not_run
               else "all examples run")
        return (f"{self.name}: {self.checked} example(s) checked in {took:.0f} s "
                f"(max {self.max_examples}, budget {self.seconds:g} s; {why})")

    def report(self, node: pytest.Item) -> None:
        """Record ``line()`` on the test for the end-of-run summary."""
        node.user_properties.append((PROPERTY, self.line()))


def summary_lines(reports: list[Any]) -> list[str]:
    """The budgets' lines among test reports (the terminal summary lists them)."""
    return [value for report in reports for key, value in getattr(report, "user_properties", ())
            if key == PROPERTY]
