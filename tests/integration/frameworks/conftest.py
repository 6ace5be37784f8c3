"""Framework tests run scripts in fresh processes (``_launch.run``), which detects a stalled
script itself (no output and no CPU used for ``STALL_S``) and shows its stacks. pytest's
per-test timeout here is only a backstop for that, long enough for a test's two runs of a
script on a busy machine: a test without its own ``timeout`` marker gets this one."""

from __future__ import annotations

from pathlib import Path

import pytest
from _launch import DEADLINE_S

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every collected item: touch only this directory's.
    for item in items:
        if _HERE in Path(item.path).resolve().parents and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(2 * DEADLINE_S + 60))
