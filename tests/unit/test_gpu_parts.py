"""benchmarks/_gpu_parts.py's Part (issue 46): every figure goes to the part's JSON lines as
it comes, and a figure whose measurement raises is recorded with its error while the part goes
on to the next one."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # after the rest

from _gpu_env import DRY  # noqa: E402
from _gpu_parts import Part  # noqa: E402


def test_a_figure_that_fails_is_recorded_and_the_next_one_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = tmp_path / "feed.jsonl"
    part = Part("feed", None, DRY, [], 2, time.monotonic() + 60, str(lines))  # type: ignore[arg-type]

    def broken() -> dict:
        raise RuntimeError("CUDA error: out of memory")

    part.attempt("image_uint8.plain", broken)
    part.attempt("image_uint8.stoker", lambda: {"batches_per_s": 3.0})
    assert part.emitted == {"image_uint8.plain": {"error": "RuntimeError: CUDA error: out of "
                                                           "memory"},
                            "image_uint8.stoker": {"batches_per_s": 3.0}}
    written = [json.loads(line) for line in lines.read_text().splitlines()]
    assert written == [
        {"part": "feed", "figure": "image_uint8.plain",
         "error": "RuntimeError: CUDA error: out of memory"},
        {"part": "feed", "figure": "image_uint8.stoker", "batches_per_s": 3.0}]
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == written
    assert "RuntimeError: CUDA error: out of memory" in err  # the traceback, for the log
