"""Two ways of doing the same work, timed alternately: each item one way, then the other, pass
after pass until a budget is spent (at least one pass), so a machine whose speed drifts slows
both alike. The measured gains of ``stoker.vision``'s import (``vision/import_gain.py``) and of
the image path (``doctor/decode_gain.py``) are its ratios."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def alternating_ms(
    items: Sequence[T],
    first: Callable[[int, T], Any],
    second: Callable[[int, T], Any],
    budget_s: float,
) -> tuple[float, float]:
    """Milliseconds per item of ``first(k, item)`` and of ``second(k, item)``, over ``items``."""
    spent_first = spent_second = 0.0
    done = 0
    end = time.perf_counter() + budget_s
    while done == 0 or time.perf_counter() < end:
        for k, item in enumerate(items):
            start = time.perf_counter()
            first(k, item)
            middle = time.perf_counter()
            second(k, item)
            spent_first += middle - start
            spent_second += time.perf_counter() - middle
        done += len(items)
    return 1e3 * spent_first / done, 1e3 * spent_second / done
