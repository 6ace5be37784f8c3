"""Ctrl-C during ``stoker doctor``, noted where no finalizer can lose it.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives: inside a
finalizer or ``__del__`` (a loader's workers being stopped by ``gc.collect()`` between runs) it
is printed as "Exception ignored" and lost, and the sweep would go on to its end. So while the
doctor measures, SIGINT also sets a flag that each run and the sweep read after the fact.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class _Noted:
    seen = False


NOTED = _Noted()


@contextlib.contextmanager
def noting_interrupts() -> Iterator[None]:
    """While inside, a SIGINT sets ``NOTED.seen`` and then does what it did before (raises
    ``KeyboardInterrupt`` by default). Off the main thread, signals are not ours to handle."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)

    def note(signum: int, frame: Any) -> None:
        NOTED.seen = True
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:
            raise KeyboardInterrupt

    NOTED.seen = False
    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        NOTED.seen = False  # read only inside: a sweep run outside must not see an old one
