"""``poll_until``: the one place a test waits for a condition that has nothing to wait on.

A file another process writes, a process that is not our child, ``/proc`` state: no event,
pipe or ``wait()`` tells when they change, so they are looked at every ``interval_s`` until
the condition holds or the deadline passes (a hang guard, never a timing assertion: the
condition decides). Everything that can be waited on (an event, a pipe, a child's exit,
``psutil.wait_procs``) is waited on instead. ``tests/unit/test_no_sleeps.py`` allows the sleep
below and no other wait by sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

INTERVAL_S = 0.05


def poll_until(condition: Callable[[], object], deadline_s: float,
               interval_s: float = INTERVAL_S) -> bool:
    """Whether ``condition()`` became true within ``deadline_s`` (looked at every
    ``interval_s``, and once more at the deadline)."""
    deadline = time.monotonic() + deadline_s
    while True:
        if condition():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return bool(condition())
        time.sleep(min(interval_s, left))  # no event to wait on: see the module doc
