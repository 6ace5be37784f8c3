"""Unit tests start no processes (DESIGN §4): a test that forks, spawns or runs a subprocess
fails here, naming what it started; it belongs in ``tests/integration``."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _matplotlib_font_cache() -> None:
    """matplotlib builds its font cache on first import by running fc-list: import it before
    ``_no_processes`` refuses that (a fresh machine, or one test alone). In a fixture, not at
    collection: every pytest process collects this file, and only those that run unit tests
    need matplotlib's 25 MiB (tests/_optional.py says why a process's size matters)."""
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError:
        pass


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(what: str) -> Any:
        def started(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(
                f"a unit test started a process ({what}); move it to tests/integration"
            )
        return started

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("Process.start"))
    monkeypatch.setattr(os, "fork", refuse("os.fork"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess.Popen"))
    yield
