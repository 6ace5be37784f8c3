"""Slabs a loader keeps between worker generations, so new workers do not allocate them again.

NOTE [ Slabs outlive workers ]
Without persistent workers every epoch forks new workers, and each one used to create its
slabs afresh: the kernel allocates and zeroes every page (about 10 ms for a 12 MiB slab of 64
224x224 images), and the main process maps the slab, then unmaps it at the end of the epoch
(1-3 ms more each, the unmaps while the next epoch waits). When an iterator's workers stop,
the slabs go into the loader's ``SlabBank`` instead: the main process keeps its mapping of
each (and closes the fd, so a bank never holds fds). A forked worker inherits every mapping
of the main process at the same address, and a shared mapping stays shared across fork, so the
next iterator hands each new worker the slabs the worker of the same id had, as addresses: the
worker writes into the inherited mapping and the main process reads its own. No new pages, no
zeroing, no mmap/munmap on either side. A slab whose batch the user still holds joins the bank
when the batch is released (NOTE [ Slab lifecycle ]), in time for a later epoch.

Memory: the bank holds what the loader's workers used, never more than ``_MAX_BANK_BYTES``
(beyond that slabs are freed as before). Deleting the loader frees it. Spawned and forkserver
workers inherit no mappings, so the bank is only used under fork.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

_MAX_BANK_BYTES = 256 << 20


class BankedSlab(NamedTuple):
    address: int  # of the main process's shared mapping (a forked worker has it too)
    nbytes: int


def _free(slab: BankedSlab) -> None:
    from stoker.transport import segments  # a bank holds slabs only once workers ran

    segments.unmap_address(slab.address, slab.nbytes)


class SlabBank:
    """Idle slabs by the id of the worker that used them; see NOTE [ Slabs outlive workers ]."""

    def __init__(self, max_bytes: int = _MAX_BANK_BYTES) -> None:
        self._max_bytes = max_bytes
        self._slabs: dict[int, list[BankedSlab]] = {}
        self._bytes = 0
        self._closed = False
        # Deposits come from an iterator's shutdown, which a finalizer may run on any thread.
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def deposit(self, worker_id: int, slab: BankedSlab) -> None:
        """Keep ``slab`` for the next worker ``worker_id``; free it if the bank is full."""
        with self._lock:
            if not self._closed and self._bytes + slab.nbytes <= self._max_bytes:
                self._slabs.setdefault(worker_id, []).append(slab)
                self._bytes += slab.nbytes
                return
        _free(slab)

    def withdraw(self, worker_id: int) -> list[BankedSlab]:
        """The slabs kept for worker ``worker_id``; the caller owns them from now on."""
        with self._lock:
            slabs = self._slabs.pop(worker_id, [])
            self._bytes -= sum(s.nbytes for s in slabs)
        return slabs

    def close(self) -> None:
        """Free every slab; later deposits are freed at once (the loader is gone)."""
        with self._lock:
            self._closed = True
            slabs = [s for group in self._slabs.values() for s in group]
            self._slabs.clear()
            self._bytes = 0
        for slab in slabs:
            _free(slab)
