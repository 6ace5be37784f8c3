"""benchmarks/gpu_feed.py --dry-run (issue 46): every part of the GPU run, on the CPU with tiny
sizes, stoker's loader copying through the fake device and Pillow standing in for nvJPEG. The
record it writes has every figure the issue asks for, and its tables render whole. Timings are
never asserted (on the fake device they mean nothing)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("PIL", reason="the JPEG files need Pillow")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PARTS = ["machine", "decode_gpu", "decode_torch", "decode_stoker", "feed", "step"]


def _table_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_table", BENCHMARKS / "gpu_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 10-15 s on the quiet 2-core machine (about 40 s at load 12); the limits only catch a hang.
@pytest.mark.timeout(180)
def test_dry_run_fills_every_figure_of_the_record(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_feed.py"), "--dry-run", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    record = json.loads((tmp_path / "gpu_feed.json").read_text())
    table = _table_module()
    assert record["dry_run"] is True and record["issue"] == 46
    assert {name: part["status"] for name, part in record["parts"].items()} == dict.fromkeys(
        PARTS, "ok"), proc.stderr
    assert table.missing_figures(record["figures"]) == []
    assert record["machine"]["device"] == "fake device (stoker.device.fake.FakeDevice) on the CPU"
    # every figure also printed as a JSON line as it came, and the tables at the end
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {line["part"] for line in lines} == set(PARTS)
    assert table.render(record) in proc.stdout
    assert "figures missing: none" in proc.stdout


_BROKEN = """
import multiprocessing, os, sys
sys.path.insert(0, {benchmarks!r})
import gpu_feed

def fails(part):
    part.emit("half", {{"images_per_s": 1.0}})
    raise RuntimeError("the part broke")

def hangs(part):  # stuck, with a process of its own, on a pipe nobody writes to
    part.emit("before", {{"images_per_s": 2.0}})
    stuck, _ = os.pipe()
    multiprocessing.get_context("fork").Process(target=os.read, args=(stuck, 1)).start()
    os.read(stuck, 1)

gpu_feed.PARTS.update(decode_torch=fails, decode_stoker=hangs)
gpu_feed.DRY_BUDGET_S, gpu_feed.GRACE_S = 3, 1
sys.exit(gpu_feed.main(["--dry-run", "--out", {out!r}, "--only", "decode_torch",
                        "decode_stoker", "machine"]))
"""


@pytest.mark.timeout(60)
def test_a_part_that_fails_or_hangs_keeps_what_it_measured_and_the_others_run(
        tmp_path: Path) -> None:
    """A part that raises is recorded with its error, one that hangs is killed with what it
    started at the end of its budget; each keeps the figures it emitted, and the parts after
    them still run."""
    script = _BROKEN.format(benchmarks=str(BENCHMARKS), out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    record = json.loads((tmp_path / "gpu_feed.json").read_text())
    parts = record["parts"]
    assert parts["decode_torch"]["status"] == "failed (exit code 1)"
    assert "RuntimeError: the part broke" in parts["decode_torch"]["error"]
    assert parts["decode_stoker"]["status"] == "timed out after 4 s"
    assert parts["machine"]["status"] == "ok"
    assert record["emitted"]["decode_torch"]["half"]["images_per_s"] == 1.0
    assert record["emitted"]["decode_stoker"]["before"]["images_per_s"] == 2.0
    assert record["machine"]["cores"] > 0
    missing = _table_module().missing_figures(record["figures"])
    assert "decode.torch_pillow.images_per_s" in missing
    assert "parts not completed: decode_torch (failed (exit code 1)), decode_stoker (timed " \
        "out after 4 s)" in proc.stdout
