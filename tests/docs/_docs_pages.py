"""The Markdown pages a user reads (README.md, docs/*.md) and their Python code blocks.

A block runs in the tests unless the line just above its opening fence is a skip marker with
a reason, for the examples that need what CI does not have (a GPU, an object store, several
processes); the integration tests named in the reason cover those:

    <!-- skip: needs CUDA (tests/gpu/test_device_cuda.py) -->
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the first code line
    code: str
    skip: str | None  # the reason, for a marked block


def pages() -> list[Path]:
    found = [ROOT / "README.md"]
    found += sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
    return found


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = str(path.relative_to(ROOT))
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match or not match.group(2):
            i += 1
            continue
        indent, lang = match.group(1), match.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang == "python":
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                    for line in lines[i + 1:end]]
            above = lines[i - 1] if i > 0 else ""
            skip = _SKIP.match(above)
            blocks.append(Block(rel, i + 2, "\n".join(body) + "\n",
                                skip.group(1) if skip else None))
        i = end + 1
    return blocks
