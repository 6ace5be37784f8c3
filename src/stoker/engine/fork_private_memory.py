"""Which of this process's memory a fork copies as it stands; read by ``main_gathers``.

NOTE [ Memory a fork copies ]
A forked worker reads its own copy of the parent's private anonymous memory (the heap,
anonymous ``MAP_PRIVATE`` mappings) as it stood at the fork: what either side writes later
stays on that side. Other memory is not a copy:

* a shared mapping (torch's shared memory, ``share_memory_()``, an anonymous
  ``mmap.mmap(-1, n)``, a ``MAP_SHARED`` file or a numpy ``memmap``) is one memory both sides
  read, so a worker sees what the parent writes after the fork;
* a file-backed private mapping (``torch.load(mmap=True)``, a copy-on-write ``memmap``) shows
  later changes of the file in every page neither side has written.

``PrivateMemory`` reads ``/proc/self/maps`` once (~0.7 ms with torch loaded) and says whether a
range lies wholly in private (``p``) anonymous (inode 0) mappings. Not shown there, and not
checked: ``MADV_DONTFORK`` and ``MADV_WIPEONFORK`` set on the memory by the program itself
(only ``/proc/self/smaps`` shows them, at ~10 ms and a walk of every mapped page).
"""

from __future__ import annotations

import bisect


class PrivateMemory:
    """This process's private anonymous mappings, as ``/proc/self/maps`` listed them when
    made; nothing found (not Linux, unreadable) means no memory is known to be private."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, bool]] = []
        try:
            with open("/proc/self/maps", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) < 5:
                continue
            lo, _, hi = fields[0].partition(b"-")
            private = fields[1][3:4] == b"p" and fields[4] == b"0"
            self._spans.append((int(lo, 16), int(hi, 16), private))
        self._spans.sort()
        self._starts = [lo for lo, _, _ in self._spans]

    def holds(self, address: int, nbytes: int) -> bool:
        """``[address, address + nbytes)`` lies in private anonymous mappings only."""
        if nbytes <= 0:
            return True
        end = address + nbytes
        i = bisect.bisect_right(self._starts, address) - 1
        at = address
        while i >= 0 and i < len(self._spans):
            lo, hi, private = self._spans[i]
            if lo > at or not private:  # a gap, or memory the worker does not copy
                return False
            if hi >= end:
                return True
            at, i = hi, i + 1
        return False
