"""Soak-test fixtures: the integration suite's leak check, and ``slow`` tests kept out by default.

The leak check (processes, threads, fds, ``/dev/shm``; see ``tests/integration/conftest.py``)
runs around every soak test, loaded from there under a private module name as
``tests/contract/conftest.py`` does. ``leak_tools`` gives the soak tests its snapshot and
polling functions, and ``shm_held`` its attribution of ``/dev/shm`` entries to processes.

Tests marked ``slow`` here (the full-size soaks) are skipped unless one of these is given:

* ``STOKER_SLOW=1`` in the environment (works however pytest is invoked);
* ``--run-slow``: registered by this file, so pytest knows it only when this directory is on
  the command line (``pytest tests/soak --run-slow``); from the repository root, where
  ``tests/soak/conftest.py`` is not loaded before the command line is parsed, use the
  environment variable;
* a ``-m`` expression naming ``slow`` (``-m slow``), other than ``-m "not slow"``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "integration" / "conftest.py"
_spec = importlib.util.spec_from_file_location("_stoker_soak_leak_check", _PATH)
assert _spec is not None and _spec.loader is not None, f"cannot load the leak check from {_PATH}"
_leak_check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _leak_check  # dataclasses look their module up there
_spec.loader.exec_module(_leak_check)

no_leaks = _leak_check.no_leaks  # autouse: every test in this directory is checked
leak_tools = _leak_check.leak_tools


@pytest.fixture
def shm_held() -> Callable[..., set[str]]:
    """``shm_held(names, only=pids | None, exclude=pids | None)``: the entries of ``names``
    that a process (in ``only``, or not in ``exclude``) has open or mapped."""
    return _leak_check._shm_held

SLOW_ENV = "STOKER_SLOW"
_HERE = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help=f"run the full-size soak tests (marked slow); or set {SLOW_ENV}=1",
    )


def slow_requested(config: pytest.Config) -> bool:
    if os.environ.get(SLOW_ENV, "").strip() not in ("", "0"):
        return True
    if config.getoption("--run-slow", default=False):
        return True
    markexpr = config.getoption("markexpr", default="") or ""
    return "slow" in markexpr and "not slow" not in markexpr


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every collected item: touch only this directory's.
    if slow_requested(config):
        return
    skip = pytest.mark.skip(
        reason=f"slow soak: set {SLOW_ENV}=1 (or pass --run-slow / -m slow) to run it"
    )
    for item in items:
        if item.get_closest_marker("slow") and _HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)
