"""Back a pytest process's heap with huge pages before each file's first test (``MADV_COLLAPSE``).

Why: the suite's CPU is ~30 % kernel time, most of it forking: each loader test forks workers
from a pytest process that holds ~320 MiB (torch, hypothesis, ~3,200 collected tests). A fork
copies one page-table entry per 4 KiB page (``copy_page_range``) and the worker's exit frees
them again (``unmap_page_range``); `perf record -a` over the differential fuzzer put 16 % of
the machine's samples in those two. A 2 MiB huge page is one entry. Measured on this 2-core
machine, 150 fuzzer examples: 13.6 user + 19.0 sys CPU-s without, 13.2 + 14.9 with.

The first file's collapse takes what collection left (~220 ms for ~120 MiB). The heap keeps
growing as tests run (what they import and keep), and new memory gets ordinary pages, so the
collapse is done again before the first test of each later file: ~1.5 ms when nothing grew,
~100 ms per 50 MiB that did. A 2-worker epoch of 4 batches, torch's DataLoader, in a
process with torch imported: 24 + 65 ms of parent + workers' CPU without, 16 + 34 ms with.

What stays true: it runs between tests, never inside one, so what a test measures of its own
process (its growth, fds, threads) is not changed; ``MADV_COLLAPSE`` does not mark the mapping
for huge pages, so what a test allocates gets ordinary pages until the next file. A worker's
first write to a shared huge page splits it and copies 4 KiB, as before, so what a worker
makes its own (USS) is unchanged; a collapse fills a 2 MiB range's holes, so the pytest
process's RSS, and the shared part of its workers', can be larger. Torch and stoker fork from
the same process, so a comparison between them is not changed. Nothing in ``src`` sees this.
Where the kernel lacks ``MADV_COLLAPSE`` (before Linux 6.1), or refuses, nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Iterable, Iterator

MADV_COLLAPSE = 25  # <linux/mman.h>
HUGE = 1 << 21  # 2 MiB, x86-64's and aarch64's (4 KiB base pages) PMD size


def collapsible(maps: Iterable[str]) -> Iterator[tuple[int, int]]:
    """The 2 MiB-aligned ``(start, length)`` inside each writable private anonymous mapping
    (and the ``[heap]``) of ``/proc/self/maps`` lines: the memory a fork copies entries for."""
    for line in maps:
        fields = line.split()
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p":
            continue
        if len(fields) > 5 and fields[5] != "[heap]":
            continue  # a file, the stack, vdso...: not the heap's pages
        start, end = (int(x, 16) for x in fields[0].split("-"))
        first, last = (start + HUGE - 1) & ~(HUGE - 1), end & ~(HUGE - 1)
        if last > first:
            yield first, last - first


_last_file: object = None


def collapse_on_new_file(path: object) -> None:
    """``collapse_heap()`` when ``path`` is not the file the last call named."""
    global _last_file
    if path != _last_file:
        _last_file = path
        collapse_heap()


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, or None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise  # type: ignore[no-any-return]


def collapse_heap() -> int:
    """Ask the kernel to back the aligned anonymous memory with huge pages; return how many
    ranges it collapsed (0 where it cannot)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    with open("/proc/self/maps") as maps:
        ranges = list(collapsible(maps))
    return sum(madvise(start, length, MADV_COLLAPSE) == 0 for start, length in ranges)
