"""Every text file stoker opens names its encoding.

A program run with ``-X warn_default_encoding`` (or ``PYTHONWARNDEFAULTENCODING=1``) gets an
``EncodingWarning`` for each ``open()`` in text mode without ``encoding=``, attributed to the
opening line; under ``-W error::EncodingWarning`` it is an exception. torch's DataLoader opens
no text file while it loads, so a loader that did would warn (or fail) where torch's run
succeeds: found by a sweep at ``workers/thread_caps.py``'s read of ``/proc/self/maps``. The
check is by construction: every such call in ``src/stoker``, not only those a run reaches.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

ROOT = Path(stoker.__file__).parent
# Calls that open text: the builtin open(), io.open(), Path.open/read_text/write_text.
_TEXT_OPENERS = {"open", "read_text", "write_text"}
# Receivers whose .open() is not a text open: PIL's Image, lmdb, tarfile, os (descriptors).
_NOT_TEXT = {"Image", "lmdb", "tarfile", "os", "image_module", "pil_image_module", "pil", "self",
             "_cursor"}


def _receiver(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        value = func.value
        if isinstance(value, ast.Name):
            return value.id
        if isinstance(value, ast.Attribute):
            return value.attr
        if isinstance(value, ast.Call):  # pil_image_module().open(...), Path(p).read_text()
            callee = value.func
            return callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
    return None


def _mode(call: ast.Call, position: int) -> object:
    for keyword in call.keywords:
        if keyword.arg == "mode":
            return keyword.value.value if isinstance(keyword.value, ast.Constant) else "?"
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        return call.args[position].value
    return "r"


def _unnamed_text_opens(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in _TEXT_OPENERS or _receiver(func) in _NOT_TEXT:
            continue
        if any(keyword.arg == "encoding" for keyword in node.keywords):
            continue
        if name == "open":
            # open(path, mode) for the builtin and io.open; Path(...).open(mode)
            position = 0 if isinstance(func, ast.Attribute) and _receiver(func) not in (
                "io", "builtins") else 1
            if "b" in str(_mode(node, position)):
                continue
        elif name == "read_text" and node.args:  # read_text(encoding) given by position
            continue
        elif name == "write_text" and len(node.args) > 1:
            continue
        rel = path.relative_to(root)
        found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_every_text_open_in_stoker_names_its_encoding():
    unnamed = [line for path in sorted(ROOT.rglob("*.py")) for line in _unnamed_text_opens(path)]
    assert unnamed == [], (
        "these open a text file without encoding=, which warns under "
        "-X warn_default_encoding where torch's DataLoader says nothing; add "
        "encoding=\"utf-8\" (errors=\"replace\" for /proc files):\n" + "\n".join(unnamed)
    )


def test_the_check_finds_an_unnamed_open(tmp_path):
    """The scan is not vacuous: it finds the cases it is meant to find, and only those."""
    source = tmp_path / "sample.py"
    source.write_text(
        "with open('/proc/self/maps') as f: pass\n"
        "with open(p, 'w') as f: pass\n"
        "with open(p, 'rb') as f: pass\n"
        "with open(p, encoding='utf-8') as f: pass\n"
        "Path(p).read_text()\n"
        "Path(p).write_text('x', encoding='utf-8')\n"
        "Image.open(p)\n",
        encoding="utf-8",
    )
    lines = [line.split(": ", 1)[0] for line in _unnamed_text_opens(source, tmp_path)]
    assert sorted(lines) == ["sample.py:1", "sample.py:2", "sample.py:5"]
