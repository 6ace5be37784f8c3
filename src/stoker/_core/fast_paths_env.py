"""``STOKER_FAST_PATHS``: the environment's half of NOTE [ One switch for the fast paths ]
(``stoker.fastpaths.switch``). Here, at the bottom, so that any layer can ask it."""

from __future__ import annotations

import os

ENV = "STOKER_FAST_PATHS"
_OFF = ("0", "false", "no", "off")


def env_allows() -> bool:
    """Whether ``STOKER_FAST_PATHS`` leaves the fast paths on (unset: on)."""
    return os.environ.get(ENV, "1").strip().lower() not in _OFF
