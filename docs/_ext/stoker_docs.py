"""Pages generated from the code at build time, so they cannot fall behind it.

A page marks where generated Markdown goes with an HTML comment on a line of its own:

* ``<!-- stoker:errors -->``: one entry per exception and warning class in ``stoker.errors``
  (what it means, what to do: from the class docstring, whose "What to do:" paragraph is
  required; a class without one fails the build);
* ``<!-- stoker:notes -->``: the index of the ``NOTE [ ... ]`` blocks in ``src/stoker``.

``tests/docs`` imports the same functions to check the pages against the code.

It also lets inline code wrap where a reader expects it: after ``_``, ``.`` and ``/`` in a name
(``worker_<wbr>concurrency``), so a table with long names fits its column without breaking
words anywhere (``_static/stoker.css``; ``tests/docs/test_site.py`` renders every page).
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "stoker")
WHAT_TO_DO = "What to do:"

_NOTE = re.compile(r"NOTE \[ ([^\]]+?) \]")
_NOTE_LINE = re.compile(r"^\s*(#\s*)?NOTE \[ ([^\]]+?) \]\s*$")
_NOTE_DOCSTRING = re.compile(r'^\s*"""NOTE \[ ([^\]]+?) \]:(?!.*""")')  # and more lines


# -- stoker.errors -------------------------------------------------------------------------------


def error_classes() -> list[type]:
    """Every exception and warning class defined in ``stoker.errors``, in source order."""
    import stoker.errors

    return [
        obj for obj in vars(stoker.errors).values()
        if isinstance(obj, type) and issubclass(obj, BaseException)
        and obj.__module__ == "stoker.errors"
    ]


def _kind(cls: type) -> str:
    bases = [b.__name__ for b in cls.__mro__[1:] if b not in (object, BaseException)]
    bases = [b for b in bases if b != "Exception" or len(bases) == 1]
    return ", ".join(f"`{b}`" for b in bases)


def troubleshooting_markdown() -> tuple[str, list[str]]:
    """The entries, and the names of classes whose docstring lacks a "What to do:" part."""
    out, missing = [], []
    for cls in error_classes():
        doc = inspect.getdoc(cls) or ""
        if WHAT_TO_DO not in doc:
            missing.append(cls.__name__)
        doc = doc.replace(WHAT_TO_DO, f"**{WHAT_TO_DO}**")
        anchor = f"error-{cls.__name__.lower()}"
        out += [
            f"({anchor})=",
            f"### `{cls.__name__}`",
            "",
            f"{{py:class}}`stoker.{cls.__name__}`, a subclass of {_kind(cls)}.",
            "",
            doc,
            "",
        ]
    return "\n".join(out), missing


# -- NOTE blocks ---------------------------------------------------------------------------------


@dataclass
class Note:
    name: str
    defined_in: list[str] = field(default_factory=list)  # "path:line", relative to src/stoker
    referred_from: set[str] = field(default_factory=set)  # paths


def _source_files() -> list[str]:
    files = []
    for folder, _, names in os.walk(SRC):
        files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    return sorted(files)


def note_blocks() -> dict[str, Note]:
    """Every ``NOTE [ name ]`` in ``src/stoker``: where its block is written, who refers to it.

    A block starts with the NOTE alone on a line, in a docstring, or in a comment followed by
    more comment lines, or (for a name with no such block) opens a docstring of several lines
    with ``NOTE [ name ]:``; anywhere else (in a sentence, or a lone comment above code) it is
    a reference.
    """
    notes: dict[str, Note] = {}
    openers: dict[str, list[str]] = {}
    for path in _source_files():
        rel = os.path.relpath(path, SRC)
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        for number, line in enumerate(lines):
            for name in _NOTE.findall(line):
                notes.setdefault(name, Note(name))
            match = _NOTE_LINE.match(line)
            block = match is not None and (
                match.group(1) is None
                or (number + 1 < len(lines) and lines[number + 1].lstrip().startswith("#"))
            )
            opening = _NOTE_DOCSTRING.match(line)
            for name in _NOTE.findall(line):
                if block and name == match.group(2):  # type: ignore[union-attr]
                    notes[name].defined_in.append(f"{rel}:{number + 1}")
                elif opening and name == opening.group(1):
                    openers.setdefault(name, []).append(f"{rel}:{number + 1}")
                else:
                    notes[name].referred_from.add(rel)
    for name, places in openers.items():  # a block only where no other block is written
        if not notes[name].defined_in:
            notes[name].defined_in = places
        else:
            notes[name].referred_from.update(p.split(":")[0] for p in places)
    return dict(sorted(notes.items(), key=lambda item: item[0].lower()))


def notes_markdown() -> str:
    rows = ["| NOTE | written in | referred to from |", "| --- | --- | --- |"]
    dangling = []
    for note in note_blocks().values():
        if not note.defined_in:
            dangling.append(note)
            continue
        where = ", ".join(f"`{d}`" for d in note.defined_in)
        refs = ", ".join(f"`{r}`" for r in sorted(note.referred_from)) or "—"
        rows.append(f"| {note.name} | {where} | {refs} |")
    text = "\n".join(rows)
    if dangling:
        names = ", ".join(f"`NOTE [ {n.name} ]` ({', '.join(sorted(n.referred_from))})"
                          for n in dangling)
        text += f"\n\nReferred to, but no block found: {names}.\n"
    return text


# -- Sphinx --------------------------------------------------------------------------------------

_MARKERS = {"<!-- stoker:errors -->": "errors", "<!-- stoker:notes -->": "notes"}


def _fill(app: Any, docname: str, source: list[str]) -> None:
    from sphinx.util import logging

    text = source[0]
    for marker, what in _MARKERS.items():
        if marker not in text:
            continue
        if what == "errors":
            generated, missing = troubleshooting_markdown()
            for name in missing:
                logging.getLogger(__name__).warning(
                    f"stoker.errors.{name} has no '{WHAT_TO_DO}' paragraph in its docstring: "
                    "the troubleshooting page needs one", location=docname)
        else:
            generated = notes_markdown()
        text = text.replace(marker, generated)
    source[0] = text


_CODE_WORD = re.compile(r'(<span class="pre">)([^<]*)(</span>)')
_BREAK_AFTER = re.compile(r"(/|(?<=[A-Za-z0-9])[_.](?=[A-Za-z0-9]))")


def _wrappable(text: str) -> str:
    """``<wbr>`` inside each word of inline code after a ``/``, and after a ``_`` or ``.``
    between letters or digits (``__init__`` stays whole): a break opportunity that copying
    the text leaves out."""
    def one(m: re.Match[str]) -> str:
        word = m.group(2)
        return m.group(1) + word[:1] + _BREAK_AFTER.sub(r"\1<wbr>", word[1:-1]) + (
            word[-1:] if len(word) > 1 else "") + m.group(3)

    return _CODE_WORD.sub(one, text)


def _code_breaks(app: Any, pagename: str, templatename: str, context: dict[str, Any],
                 doctree: Any) -> None:
    if "body" in context:
        context["body"] = _wrappable(context["body"])


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _fill)
    app.connect("html-page-context", _code_breaks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
