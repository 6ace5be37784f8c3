"""Every Markdown table of the README and docs/*.md renders whole (issue 46: a table that lost
its header row rendered as plain text): outside code fences, a run of lines starting with ``|``
is a header row, then a ``| --- |`` separator with as many cells, then rows of as many cells."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _docs_pages import ROOT, pages

_SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")


def _cells(line: str) -> int:
    # a | inside `code` or escaped (\|) does not start a cell
    line = re.sub(r"`[^`]*`", "", line.replace("\\|", ""))
    return line.strip().strip("|").count("|") + 1


def table_problems(text: str) -> list[str]:
    """What is wrong with each table of ``text``, as 'line N: ...'."""
    lines, problems, fenced, i = text.splitlines(), [], False, 0
    while i < len(lines):
        if lines[i].lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if fenced or not lines[i].startswith("|"):
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        table, where = lines[i:j], f"line {i + 1}"
        if len(table) < 2 or not _SEPARATOR.match(table[1]):
            problems.append(f"{where}: no header row (a | --- | line right after the first row)"
                            f": {table[0][:80]}")
        else:
            width = _cells(table[0])
            for k, row in enumerate(table[1:], start=i + 2):
                if _cells(row) != width:
                    problems.append(f"line {k}: {_cells(row)} cells, the header has {width}")
        i = j
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_has_a_header_row(page: Path) -> None:
    assert table_problems(page.read_text(encoding="utf-8")) == []


def test_a_table_without_its_header_row_is_found() -> None:
    text = "Text.\n\n| a | 1 |\n| b | 2 |\n\n| x | y |\n| --- | --- |\n| 1 | 2 | 3 |\n"
    assert table_problems(text) == [
        "line 3: no header row (a | --- | line right after the first row): | a | 1 |",
        "line 8: 3 cells, the header has 2",
    ]
    assert table_problems("```\n| not | a table |\n```\n| a | `b|c` |\n| --- | --- |\n") == []
