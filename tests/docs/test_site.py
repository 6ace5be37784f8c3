"""The docs site builds with no warning, and it cannot fall behind the code.

* every public name (``stoker.__all__`` and the ``__all__`` of the public subpackages) has a
  docstring and an entry in the API reference (the built site's ``objects.inv``);
* every exception and warning class of ``stoker.errors`` has a troubleshooting entry saying
  what to do, and every module that calls ``warnings.warn`` is named on that page;
* every ``NOTE [ ... ]`` referred to in ``src/stoker`` has exactly one block;
* no built page is wider than its content column in a 1280 px window (headless Chromium).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest
from _docs_pages import DOCS, ROOT, pages

from _browser import CHROMIUM, MISSING, probe

sys.path.insert(0, str(DOCS / "_ext"))
import stoker_docs  # noqa: E402

import stoker  # noqa: E402

PUBLIC_SUBPACKAGES = [name for name in stoker.__all__
                      if isinstance(getattr(stoker, name), types.ModuleType)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"the docs build failed or warned:\n{done.stderr[-6000:]}"
    return out / "html"


def inventory(site: Path) -> set[str]:
    """The Python objects the built site documents (names from ``objects.inv``)."""
    raw = (site / "objects.inv").read_bytes()
    body = raw.split(b"\n", 4)[4]  # four header lines, then zlib
    names = set()
    for line in zlib.decompress(body).decode().splitlines():
        name, role = line.split(" ", 2)[:2]
        if role.startswith("py:"):
            names.add(name)
    return names


def public_names() -> list[tuple[str, str, object]]:
    out = [("stoker", n, getattr(stoker, n)) for n in stoker.__all__]
    for package in PUBLIC_SUBPACKAGES:
        module = importlib.import_module(f"stoker.{package}")
        out += [(f"stoker.{package}", n, getattr(module, n)) for n in module.__all__]
    return out


def own_docstring(owner: str, name: str, obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__doc__ or ""
    if isinstance(obj, type):
        return obj.__dict__.get("__doc__") or ""
    if callable(obj):
        return getattr(obj, "__doc__", None) or ""
    # A constant: a ``#:`` comment where it is defined (what autodoc reads).
    from sphinx.pycode import ModuleAnalyzer

    for module_name in _defining_modules(owner, name):
        docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        if ("", name) in docs:
            return "\n".join(docs[("", name)])
    return ""


def _defining_modules(owner: str, name: str) -> list[str]:
    module = importlib.import_module(owner)
    pattern = re.compile(rf"from (\S+) import .*\b{re.escape(name)}\b")
    found = pattern.search(inspect.getsource(module))
    return [owner] + ([found.group(1)] if found else [])


def test_docs_build_without_warnings(site: Path) -> None:
    for page in ("index", "api", "troubleshooting", "design", "same_as_torch", "benchmarks"):
        assert (site / f"{page}.html").exists(), page


@pytest.mark.parametrize("owner,name,obj", public_names(),
                         ids=[f"{o}.{n}" for o, n, _ in public_names()])
def test_public_name_has_a_docstring(owner: str, name: str, obj: object) -> None:
    assert own_docstring(owner, name, obj).strip(), (
        f"{owner}.{name} has no docstring of its own (a constant: a '#:' comment above it)")


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    documented = inventory(site)
    objects = {}
    for full in documented:
        module, _, attr = full.rpartition(".")
        try:
            objects[id(getattr(importlib.import_module(module), attr))] = full
        except (ImportError, AttributeError, ValueError):
            continue
    missing = [f"{owner}.{name}" for owner, name, obj in public_names()
               if f"{owner}.{name}" not in documented and id(obj) not in objects]
    assert not missing, f"public names with no entry in docs/api.md: {missing}"


def test_every_error_class_has_a_troubleshooting_entry(site: Path) -> None:
    generated, missing = stoker_docs.troubleshooting_markdown()
    assert not missing, f"stoker.errors classes without a 'What to do:' paragraph: {missing}"
    page = (site / "troubleshooting.html").read_text(encoding="utf-8")
    for cls in stoker_docs.error_classes():
        assert f'id="error-{cls.__name__.lower()}"' in page, cls.__name__


def test_every_module_that_warns_is_named_in_troubleshooting() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    src = ROOT / "src" / "stoker"
    warning = re.compile(r"\bwarnings\.warn\(")
    missing = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(("cli/", "doctor/")):
            continue  # commands: what they say goes to the terminal, not to a program
        if warning.search(path.read_text(encoding="utf-8")) and f"`{rel}`" not in page:
            missing.append(rel)
    assert not missing, (
        f"modules that call warnings.warn but are not in docs/troubleshooting.md's table of "
        f"other warnings: {missing}; add a row saying what the warning means and what to do")


def test_every_note_referred_to_has_one_block() -> None:
    notes = stoker_docs.note_blocks()
    wrong = {n.name: n.defined_in for n in notes.values() if len(n.defined_in) != 1}
    assert not wrong, (
        f"NOTE names with no block or several ({wrong}): write the block once, as a "
        "'NOTE [ name ]' line of its own followed by its text, and refer to it by name")


def test_every_table_has_a_header_row() -> None:
    # A separator row with no header above it renders as plain text, with no build warning.
    headless = []
    for page in pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*\|\s*-{3}", line) and not (
                    i and re.match(r"\s*\|", lines[i - 1])):
                headless.append(f"{page.relative_to(ROOT)}:{i + 1}")
    assert not headless, f"tables without a header row: {headless}"


# Everything in the content column (``div.body``) that reaches past its edges, or hides part
# of itself behind a scrollbar (a ``pre`` with ``overflow: auto``), as the browser laid it out.
_OVERFLOW_PROBE = """
<script>
window.addEventListener("load", () => {
  const column = document.querySelector("div.body"), col = column.getBoundingClientRect();
  const over = [];
  for (const el of column.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    const clipped = el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1
      && getComputedStyle(el).overflowX !== "visible";
    if (clipped || r.right > col.right + 1 || r.left < col.left - 1) {
      over.push({tag: el.tagName.toLowerCase(), cls: String(el.className), clipped: clipped,
                 left: Math.round(r.left), right: Math.round(r.right),
                 text: (el.textContent || "").trim().slice(0, 80)});
    }
  }
  const found = {window: innerWidth, page: document.documentElement.scrollWidth,
                 column: [Math.round(col.left), Math.round(col.right)], over: over};
  const out = document.createElement("pre");
  out.id = "probe";
  out.style.display = "none";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>
"""


@pytest.mark.skipif(CHROMIUM is None, reason=MISSING)
@pytest.mark.timeout(900)
def test_no_page_is_wider_than_its_column_at_1280_px(site: Path, tmp_path: Path) -> None:
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    wide = {}
    for page in sorted(DOCS.glob("*.md")):
        seen = probe(site / f"{page.stem}.html", _OVERFLOW_PROBE, tmp_path / "profile")
        assert seen["window"] == 1280, seen
        if seen["over"] or seen["page"] > seen["window"]:
            wide[page.name] = {"page": seen["page"], "column": seen["column"],
                               "over": seen["over"][:6]}
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"chromium left processes behind: {left}"
    assert not wide, "pages wider than their column at 1280 px:\n" + json.dumps(wide, indent=1)
