"""What the main process keeps of a worker's answer (NOTE [ Stacks on request ]), and the
stack signal wanted only inside ``stacks_by_signal`` (NOTE [ The stack signal ]); a worker's
side runs in tests/integration/test_worker_stack_log.py."""

from __future__ import annotations

from stoker.workers import diagnostics
from stoker.workers.diagnostics import _others


def test_the_dumping_threads_block_is_left_out():
    dump = ("Thread 0x1 (most recent call first):\n  File \"a.py\", line 3 in __getitem__\n\n"
            "Current thread 0x2 (most recent call first):\n  File \"e.py\", line 9 in _watch\n\n"
            "Thread 0x3 (most recent call first):\n  File \"b.py\", line 1 in run\n")
    assert _others(dump) == ("Thread 0x1 (most recent call first):\n"
                             "  File \"a.py\", line 3 in __getitem__\n\n"
                             "Thread 0x3 (most recent call first):\n  File \"b.py\", line 1 in run")


def test_signal_wanted_only_inside_the_block():
    assert not diagnostics.signal_wanted()
    with diagnostics.stacks_by_signal():
        with diagnostics.stacks_by_signal():
            assert diagnostics.signal_wanted()
        assert diagnostics.signal_wanted()
    assert not diagnostics.signal_wanted()
