"""The doctor's progress on stderr while it measures: one line per run, rewritten in place on
a terminal (the command line's and the script mode's, ``cli/doctor.py`` and ``script.py``)."""

from __future__ import annotations

import sys
import time


class ProgressLine:
    """One line per run on stderr, rewritten in place on a terminal."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._label = ""
        self._shown_at = 0.0

    def announce(self, text: str) -> None:
        self._label = text
        self._end_line()
        print(f"stoker doctor: {text} ...", file=sys.stderr, end="" if self._tty else "\n",
              flush=True)

    def update(self, label: str, batches: int, seconds: float) -> None:
        now = time.monotonic()
        if self._tty and now - self._shown_at > 0.25:
            self._shown_at = now
            print(f"\rstoker doctor: {self._label} ... {seconds:4.1f} s, {batches} batches",
                  file=sys.stderr, end="", flush=True)

    def _end_line(self) -> None:
        if self._tty and self._shown_at:
            print(file=sys.stderr)
            self._shown_at = 0.0

    def done(self) -> None:
        self._end_line()

