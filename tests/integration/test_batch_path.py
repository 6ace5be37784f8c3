"""src/stoker/README.md's walk of one steady-state batch names exactly the stoker modules that
batch passes through (issue 35), traced by benchmarks/batch_path.py: a module added to the
path, or one the walk names that the batch no longer visits, fails here until the walk says so."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _batch_path() -> object:
    path = ROOT / "benchmarks" / "batch_path.py"
    spec = importlib.util.spec_from_file_location("batch_path", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _walk_modules() -> set[str]:
    text = (ROOT / "src" / "stoker" / "README.md").read_text()
    start = text.index("this list against the trace). In the main process:")
    end = text.index("With `slab_transport` (beyond torch), the batch goes through slabs")
    names = re.findall(r"`([a-z_]+/[a-z_]+)\.py`", text[start:end])
    return {"stoker." + name.replace("/", ".") for name in names}


def test_the_walk_names_exactly_the_modules_a_batch_passes_through() -> None:
    main_side, worker_side, batches = _batch_path().trace()  # type: ignore[attr-defined]
    assert batches > 0 and main_side and worker_side  # the trace saw both sides
    traced = set(main_side) | set(worker_side)
    walk = _walk_modules()
    assert traced == walk, (
        f"modules on the path but not in the walk: {sorted(traced - walk)}; in the walk but "
        f"not on the path: {sorted(walk - traced)}")
    assert sys.getprofile() is None
