"""src/stoker/README.md's walk of one steady-state batch names exactly the stoker modules that
batch passes through (issue 35), traced by benchmarks/batch_path.py: a module added to the
path, or one the walk names that the batch no longer visits, fails here until the walk says so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _trace() -> dict:
    """benchmarks/batch_path.py's record: the modules each side's calls were in."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "batch_path.py")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _walk_modules() -> set[str]:
    text = (ROOT / "src" / "stoker" / "README.md").read_text()
    start = text.index("this list against the trace). In the main process:")
    end = text.index("With `slab_transport` (beyond torch), the batch goes through slabs")
    names = re.findall(r"`([a-z_]+/[a-z_]+)\.py`", text[start:end])
    return {"stoker." + name.replace("/", ".") for name in names}


def test_the_walk_names_exactly_the_modules_a_batch_passes_through() -> None:
    record = _trace()
    assert record["main"] and record["worker"]  # the trace saw both sides
    traced = set(record["main"]) | set(record["worker"])
    walk = _walk_modules()
    assert traced == walk, (
        f"modules on the path but not in the walk: {sorted(traced - walk)}; in the walk but "
        f"not on the path: {sorted(walk - traced)}")
