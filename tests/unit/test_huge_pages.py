"""The suite's huge-page step picks only the writable private anonymous memory, 2 MiB-aligned
(tests/_huge_pages.py)."""

from __future__ import annotations

import pytest

import _huge_pages

MAPS = """\
55d0a0000000-55d0a0001000 r--p 00000000 08:01 123 /usr/bin/python3.11
55d0a0400000-55d0a0a00000 rw-p 00000000 00:00 0 [heap]
7f0000100000-7f0000700000 rw-p 00000000 00:00 0
7f0000800000-7f0000900000 rw-p 00000000 00:00 0
7f0001000000-7f0001400000 rw-s 00000000 00:01 9 /dev/shm/segment
7f0002000000-7f0002400000 rw-p 00001000 08:01 456 /lib/libtorch_cpu.so
7f0003000000-7f0003400000 r--p 00000000 00:00 0
7ffd00000000-7ffd00400000 rw-p 00000000 00:00 0 [stack]
"""


def test_only_the_heap_and_anonymous_private_memory_is_picked_aligned() -> None:
    picked = list(_huge_pages.collapsible(MAPS.splitlines()))
    assert picked == [
        (0x55D0A0400000, 0x600000),  # the heap: already aligned, three huge pages
        (0x7F0000200000, 0x400000),  # rounded in to 2 MiB boundaries
        # 7f0000800000-7f0000900000 holds no whole huge page; shared, file-backed, read-only
        # and the stack are never picked
    ]


def test_what_it_says_it_collapsed_is_backed_by_huge_pages() -> None:
    collapsed = _huge_pages.collapse_heap()
    if not collapsed:
        pytest.skip("this kernel collapses nothing (MADV_COLLAPSE needs Linux 6.1)")
    with open("/proc/self/smaps_rollup") as rollup:
        huge_kib = next(int(line.split()[1]) for line in rollup
                        if line.startswith("AnonHugePages:"))
    assert huge_kib >= 2048 * collapsed
