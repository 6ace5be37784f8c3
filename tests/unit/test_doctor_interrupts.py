"""A Ctrl-C that lands in a finalizer (Python prints "Exception ignored" and goes on) still
stops ``stoker doctor``: its handler notes it (doctor/interrupts.py)."""

from __future__ import annotations

import gc
import signal
import sys
import weakref
from collections.abc import Iterator

import pytest

from stoker.doctor.interrupts import NOTED, noting_interrupts


class _Held:
    pass


@pytest.fixture(autouse=True)
def _default_ctrl_c() -> Iterator[None]:
    """Python's own SIGINT handler for the test, whatever the process had (a process started
    with SIGINT ignored keeps it ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_a_finalizer_swallows_is_still_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    lost: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: lost.append(u.exc_type))
    with noting_interrupts():
        held = _Held()
        weakref.finalize(held, signal.raise_signal, signal.SIGINT)
        del held  # the KeyboardInterrupt is raised in the finalizer, and lost there
        gc.collect()
        assert lost == [KeyboardInterrupt] and NOTED.seen
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not NOTED.seen  # outside, nothing is noted: a sweep run there goes on


def test_a_plain_ctrl_c_still_raises_and_is_noted() -> None:
    with noting_interrupts():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert NOTED.seen
