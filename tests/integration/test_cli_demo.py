"""`stoker demo` end to end, in a subprocess: a 64-image run prints the comparison table."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("PIL", reason="stoker demo needs the demo extra (pillow)")
pytest.importorskip("psutil", reason="stoker demo needs the demo extra (psutil)")


def test_demo_prints_the_comparison_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "demo", "--images", "64", "--epochs", "1",
         "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    runs = next(line for line in lines if line.startswith("medians of 2 runs each"))
    assert len(runs.split(": ")[-1].split()) == 2, runs  # each round's ratio
    header = next(line for line in lines if line.split()[-1:] == ["stoker/torch"])
    assert header.split() == ["torch", "stoker", "stoker/torch"]
    for row in ("samples/s", "time to first batch", "peak memory (PSS)"):
        matching = [line for line in lines if line.startswith(row)]
        assert len(matching) == 1, f"no {row!r} row in:\n{proc.stdout}"
        assert matching[0].split()[-4].endswith("x"), matching[0]  # the ratio column


def test_demo_without_a_command_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "COMMAND" in proc.stderr


def test_demo_without_the_demo_extra_says_how_to_install_it() -> None:
    hide_pillow = (
        "import sys; sys.modules['PIL'] = None; from stoker.cli import main; "
        "raise SystemExit(main(['demo', '--images', '1']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", hide_pillow], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "stoker demo needs pillow, which is not installed. "
        "Install the demo extra: pip install 'stoker[demo]'"
    )
    assert proc.stdout == ""
