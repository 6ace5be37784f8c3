"""Every Python example in README.md and docs/ runs, page by page, in a fresh process.

The blocks of one page share a namespace and run in order, from an empty temporary directory
(an example makes the small data it needs). Blocks marked ``<!-- skip: reason -->`` are left
out; the reason must name what they need and where that is tested (``_docs_pages.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _docs_pages import ROOT, pages, python_blocks

RUNNER = Path(__file__).with_name("_run_blocks.py")
PAGES = [p for p in pages() if python_blocks(p)]


def test_pages_have_examples():
    assert ROOT / "README.md" in PAGES
    assert len(PAGES) >= 8, [str(p) for p in PAGES]


def test_every_skipped_block_says_why_and_where_it_is_tested():
    for page in pages():
        for block in python_blocks(page):
            if block.skip is not None:
                assert "tests/" in block.skip, (
                    f"{block.page}:{block.line}: a skipped example names the test that covers "
                    f"it (<!-- skip: needs X (tests/...) -->); got {block.skip!r}"
                )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(page: Path, tmp_path: Path):
    blocks = [b.__dict__ for b in python_blocks(page) if b.skip is None]
    if not blocks:
        return  # every block of the page needs what CI lacks (checked above)
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(blocks))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), STOKER_BEYOND_TORCH="")
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(spec)], cwd=work, env=env, capture_output=True,
        text=True, timeout=100,
    )
    assert done.returncode == 0, f"{page.name}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
