"""The order ``tests/_xdist_order.py`` makes is the order pytest-xdist hands files out in.

A real ``pytest -n 1 --dist loadfile`` run over two files, with the root conftest's two hooks:
the file listed as heaviest has one test, the other five, and xdist on its own would start the
one with more tests first (it did, and the suite's heaviest files ran last)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="the order only matters with pytest-xdist")

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import _xdist_order

def pytest_configure(config):
    _xdist_order.keep_collection_order(config)

def pytest_collection_modifyitems(config, items):
    _xdist_order.heaviest_first(items, ("test_heavy.py",))
"""

RECORD = """
import os

def record(name):
    with open(os.environ["ORDER_LOG"], "a") as log:
        log.write(name + "\\n")
"""


def test_the_heaviest_file_starts_first_though_it_has_the_fewest_tests(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "order_log.py").write_text(RECORD)
    (tmp_path / "test_heavy.py").write_text(
        "from order_log import record\n\ndef test_heavy():\n    record('heavy')\n")
    (tmp_path / "test_many.py").write_text(
        "import pytest\nfrom order_log import record\n\n"
        "@pytest.mark.parametrize('k', range(5))\ndef test_many(k):\n    record('many')\n")
    log = tmp_path / "order.log"
    env = {**os.environ, "ORDER_LOG": str(log), "PYTHONPATH": str(tmp_path)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "--dist", "loadfile", "-q",
         "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().split() == ["heavy"] + ["many"] * 5, proc.stdout
