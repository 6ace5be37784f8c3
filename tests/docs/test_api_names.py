"""The README and docs name stoker's functions as stoker spells them: an inline code span that
names a near miss of a public name (``decode_crop`` for ``decode_crop_into``) is a name a user
would try to import and not find."""

from __future__ import annotations

import importlib
import re
import types

from _docs_pages import ROOT, pages

_MODULES = ("stoker", "stoker.image", "stoker.formats", "stoker.distributed", "stoker.testing",
            "stoker.sharing", "stoker.storage",
            "stoker.vision.datasets", "stoker.vision.transforms")
_SPAN = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*_[A-Za-z0-9_]+\b")  # snake_case names


def _public() -> set[str]:
    """The public functions' and classes' names (not the subpackages')."""
    names: set[str] = set()
    for name in _MODULES:
        module = importlib.import_module(name)
        names.update(n for n in getattr(module, "__all__", ())
                     if not isinstance(getattr(module, n), types.ModuleType))
    return names


def near_misses(text: str, public: set[str]) -> list[str]:
    """Names in ``text``'s code spans that a public name extends by a word, or that extend a
    public name of several words by one."""
    found = []
    for span in _SPAN.findall(text):
        for name in _NAME.findall(span):
            if name in public:
                continue
            near = sorted(p for p in public if p.startswith(name + "_") or (
                "_" in p and name.startswith(p + "_")))  # a one-word name starts many
            if near:
                found.append(f"`{name}` (stoker has {', '.join(near)})")
    return found


def test_a_near_miss_is_found():
    assert near_misses("`TarShards(transform=decode_crop)`", {"decode_crop_into"}) == [
        "`decode_crop` (stoker has decode_crop_into)"]


def test_pages_name_stokers_functions_as_stoker_spells_them():
    public = _public()
    bad = {str(page.relative_to(ROOT)): near_misses(page.read_text(encoding="utf-8"), public)
           for page in pages()}
    assert {page: names for page, names in bad.items() if names} == {}
