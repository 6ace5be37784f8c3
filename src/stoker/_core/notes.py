"""``add_note`` on any supported Python: 3.11's ``BaseException.add_note``, or on 3.10 the same
``__notes__`` attribute (shown by 3.11+ tracebacks and by traceback-aware tools)."""

from __future__ import annotations


def add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
