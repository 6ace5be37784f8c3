"""The pages a user reads say what to write and what it prints; how stoker does it (the
``NOTE [ ... ]`` blocks, the source files) is on the design notes page (``docs/design.md``).
The install instructions work today: stoker is not on PyPI yet, so they say how to install
it from a clone or a wheel, and keep ``pip install stoker`` for when it is."""

from __future__ import annotations

import re

import pytest
from _docs_pages import DOCS, ROOT

# The guides, listed by hand: a new page is a user page unless it is added to DESIGN_PAGES.
USER_PAGES = ["README.md"] + [f"docs/{name}.md" for name in (
    "index", "from_torch", "same_as_torch", "from_torchdata", "from_streaming", "resume",
    "distributed", "frameworks", "data_at_rest", "image_path", "vision", "gpu_feed", "doctor",
    "troubleshooting")]
# Reference pages: the API (generated from docstrings), the measurements, the design notes.
DESIGN_PAGES = ["docs/api.md", "docs/benchmarks.md", "docs/design.md"]
INSTALL_PAGES = ["README.md", "docs/index.md"]


def test_every_page_is_listed_as_a_user_page_or_a_reference_page() -> None:
    found = {str(p.relative_to(ROOT)) for p in DOCS.glob("*.md")} | {"README.md"}
    assert found == set(USER_PAGES) | set(DESIGN_PAGES), (
        "list each docs page in USER_PAGES (what to write, what it prints) or DESIGN_PAGES")


_NAMED = re.compile(r"NOTEs?\s*\[|src/stoker")


@pytest.mark.parametrize("page", USER_PAGES)
def test_user_pages_name_no_notes_and_no_source_paths(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    found = [f"{page}:{text.count(chr(10), 0, m.start()) + 1}: "
             f"{text[m.start():m.start() + 60]!r}" for m in _NAMED.finditer(text)]
    assert not found, (
        "a user page names a NOTE block or a source path; say what to write and what it "
        "prints, and put how it works in docs/design.md:\n" + "\n".join(found))


def test_the_design_notes_keep_what_the_guides_left_out() -> None:
    import sys

    sys.path.insert(0, str(DOCS / "_ext"))
    import stoker_docs

    design = " ".join((DOCS / "design.md").read_text(encoding="utf-8").split())
    for name in ("Batches cross as torch's do", "Small leaves do not hold the slab",
                 "Automatic list sharing", "Only stragglers move", "Pickle once",
                 "Loader shutdown", "Worker streams resume", "Fused decode in Compose",
                 "Same as torch unless asked", "Shard cache"):
        assert f"NOTE [ {name} ]" in design, name
    written = stoker_docs.note_blocks()
    named = set(re.findall(r"NOTE \[ (.+?) \]", design)) - {"...", "name"}
    assert named and not named - set(written), (
        f"docs/design.md names NOTE blocks src/stoker does not have: {named - set(written)}")


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)


@pytest.mark.parametrize("page", INSTALL_PAGES)
def test_install_says_how_to_install_until_stoker_is_published(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    said = " ".join(text.split())
    assert "stoker is not published on PyPI yet" in said
    commands = "\n".join(_shell_blocks(text))
    assert "git clone" in commands and "pip install -e ./stoker" in commands, commands
    assert "python -m build --wheel" in commands and "pip install dist/stoker-*.whl" in commands
    assert "scripts/setup.sh" in said
    # ``pip install stoker`` stays, as what it will be once published, after saying so
    first = text.index("pip install stoker")
    assert "not published on PyPI yet" in " ".join(text[:first].split())
    once = re.search(r"[Oo]nce (stoker is )?published", text)
    assert once and text.rindex("pip install stoker") > once.start(), page
