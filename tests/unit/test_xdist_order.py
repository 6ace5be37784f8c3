"""``tests/_xdist_order.py``: its files exist, and the reordering keeps everything else."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _xdist_order

ROOT = Path(__file__).resolve().parents[2]


def test_every_entry_names_an_existing_file() -> None:
    missing = [path for path in _xdist_order.HEAVIEST if not (ROOT / path).is_file()]
    assert not missing, f"tests/_xdist_order.py's HEAVIEST names missing files: {missing}"
    assert len(set(_xdist_order.HEAVIEST)) == len(_xdist_order.HEAVIEST)


def test_listed_files_start_first_and_the_rest_keep_their_order() -> None:
    first, second = _xdist_order.HEAVIEST[:2]
    ids = ["tests/unit/a.py::t1", f"{second}::t1", "tests/unit/b.py::t1", f"{first}::t1",
           f"{second}::t2", "tests/unit/a.py::t2", f"{first}::t2[x]"]
    items: list[Any] = [SimpleNamespace(nodeid=i) for i in ids]
    _xdist_order.heaviest_first(items)
    assert [i.nodeid for i in items] == [
        f"{first}::t1", f"{first}::t2[x]", f"{second}::t1", f"{second}::t2",
        "tests/unit/a.py::t1", "tests/unit/b.py::t1", "tests/unit/a.py::t2"]
