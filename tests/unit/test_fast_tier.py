"""The fast tier's list (``tests/_tiers.py``) names files and tests that exist, each with why,
and ``scripts/test.sh`` translates ``--fast`` rather than passing it to pytest."""

from __future__ import annotations

import re
from pathlib import Path

import _tiers

ROOT = Path(__file__).resolve().parents[2]


def test_every_fast_entry_names_an_existing_test() -> None:
    missing = []
    for entry, why in _tiers.FAST:
        assert why.strip(), f"{entry}: say why it is in the fast tier"
        path, _, name = entry.partition("::")
        file = ROOT / path
        if not file.is_file():
            missing.append(f"{entry} (no such file)")
        elif name and not re.search(rf"^(async )?def {re.escape(name)}\(",
                                    file.read_text(encoding="utf-8"), re.MULTILINE):
            missing.append(f"{entry} (no such test in the file)")
    assert not missing, f"tests/_tiers.py's FAST names what does not exist: {missing}"


def test_an_entry_selects_its_tests_and_their_parameters_only() -> None:
    entry = _tiers.FAST[0][0]
    assert _tiers.in_fast_tier(entry)
    assert _tiers.in_fast_tier(entry + "[x-1]")
    assert not _tiers.in_fast_tier(entry + "_soak")
    assert not _tiers.in_fast_tier("tests/unit/test_not_listed.py::test_x")


def test_the_script_translates_fast() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert 'if [ "$arg" = "--fast" ]; then' in script
    assert f"export {_tiers.FAST_ENV}=1" in script
