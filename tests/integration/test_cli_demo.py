"""`stoker demo` end to end, in a subprocess: a 64-image run prints the tiers' table."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("PIL", reason="stoker demo needs the demo extra (pillow)")
pytest.importorskip("psutil", reason="stoker demo needs the demo extra (psutil)")


def _demo(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "demo", "--images", "64", "--epochs", "1", *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout.splitlines()


def _tier_rows(lines: list[str]) -> list[list[str]]:
    header = lines.index(next(line for line in lines if line.startswith("tier ")))
    assert lines[header].split() == ["tier", "samples/s", "vs", "torch", "first", "batch",
                                     "peak", "PSS"]
    rows = []
    for line in lines[header + 1:]:
        if not line:
            break
        rows.append(line.split())
    return rows


def test_demo_prints_the_tiers_with_their_ratios_and_changed_lines() -> None:
    lines = _demo("--rounds", "2", "--packed")
    runs = next(line for line in lines if line.startswith("medians of 2 runs each"))
    per_tier = runs.split(": ", 1)[-1].split("; ")
    assert [t.rsplit(" ", 2)[0] for t in per_tier] == [
        "stoker", "stoker.vision", "image path", "packed"], runs
    rows = _tier_rows(lines)
    assert [row[0] for row in rows] == ["1", "2", "3", "4", "5"], rows
    assert " ".join(rows[2][1:5]) == "+ stoker.vision, same pipeline", rows
    assert " ".join(rows[3][1:7]) == "+ __getitem__ on the image path", rows
    assert rows[0][-5] == "1.00x", rows  # torch against itself
    for row in rows:
        assert row[-5].endswith("x") and row[-3] == "s" and row[-1] == "MiB", row
    text = "\n".join(lines)
    assert "  2  from torch.utils.data import DataLoader\n     -> from stoker import DataLoader" \
        in text
    assert ("  3  from torchvision import datasets, transforms\n"
            "     -> from stoker.vision import datasets, transforms") in text
    assert "     -> img = decode_crop_into(data, out, sample_rng())" in text
    assert "  5  dataset = JpegDataset(paths)" in text
    assert "tier 1 pipeline: stoker.vision, fuse=False (torchvision's steps)" in lines or (
        "tier 1 pipeline: torchvision" in lines)
    decoder = next(line for line in lines if line.startswith("image path decoder: "))
    assert decoder.endswith("(the fastimage extra)") or decoder.endswith(
        "pip install 'stoker[fastimage]'"), decoder
    verdict = lines[-1]
    best = max(rows[1:], key=lambda row: float(row[-6]))
    assert verdict.startswith(f"verdict: {best[-5]} torch's samples/s with tier {best[0]} "), (
        verdict)


def test_the_image_path_runs_on_pillow_without_the_fastimage_extra() -> None:
    hide_fastimage = (
        "import sys; sys.modules['simplejpeg'] = None; sys.modules['cv2'] = None; "
        "from stoker.cli import main; "
        "raise SystemExit(main(['demo', '--images', '32', '--rounds', '1']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", hide_fastimage], capture_output=True, text=True, timeout=150
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert [row[0] for row in _tier_rows(lines)] == ["1", "2", "3", "4"]
    assert "image path decoder: Pillow (the fallback); for the fast one install the fastimage " \
        "extra (simplejpeg + OpenCV): pip install 'stoker[fastimage]'" in lines


def test_an_a_a_run_compares_torch_with_itself_only() -> None:
    lines = _demo("--rounds", "1", "--compare-with", "torch.utils.data:DataLoader")
    rows = _tier_rows(lines)
    assert [row[0] for row in rows] == ["1", "2"], rows
    assert not any(line.startswith("image path decoder") for line in lines)


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
