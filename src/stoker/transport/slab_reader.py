"""Main-process side of the transport: turn a packed batch back into tensors over shared memory.

NOTE [ Slab lifecycle ]
1. A worker creates a slab (``segments.create``) and announces it; the main process adopts the
   fd (``SlabReader.adopt``). Both keep the fd until the slab is retired.
2. The worker collates a batch into a free slab and sends (segment id, bytes used, payload).
3. ``SlabReader.unpack`` maps the slab once (its first batch; the mapping is kept, so later
   batches cost no ``mmap`` and no page faults) and hands out each batch as a *lease*: a
   buffer over the bytes used, of which every large tensor and array of the batch is a view.
   The user's tensors hold the lease alive. Small leaves are copied out instead (NOTE [ Small
   leaves do not hold the slab ]).
4. When the last tensor of the batch dies, the lease is collected and a finalizer queues
   (worker id, segment id) on ``released``. The iterator sends these ids back with the worker's
   next task and only then does the worker write into that slab again. A batch the user keeps
   forever simply keeps its slab; the worker makes a new one.
5. Retired slabs (too many idle) are closed on both sides; at shutdown every fd is closed and
   every mapping no lease uses is unmapped. A mapping a lease still uses outlives its fd and is
   unmapped by the lease's finalizer, so batches the user keeps stay valid.
6. Under fork, shutdown gives the slabs to the loader's bank instead (mapping kept, fd
   closed; a leased one once its lease ends), for the next iterator's workers (NOTE [ Slabs
   outlive workers ]).
7. With a ``pins`` (pin_memory=True or device=), a mapping is page-locked when its first batch
   is read, unpinned before it is unmapped or banked, and released slabs reach the worker only
   through ``pins.gate`` (NOTE [ Slabs pinned in place ] in ``stoker.device.host_pins``).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import io
import pickle
import threading
from typing import Any

import numpy as np
import torch

from stoker._core.protocols import HostPinner
from stoker.transport import segments
from stoker.transport.segments import SegmentRef
from stoker.transport.slab_bank import BankedSlab, SlabBank

# NOTE [ Small leaves do not hold the slab ]
# torch's workers give every tensor of a batch its own shared memory, so a training loop that
# keeps only the labels or predictions of each batch (for its metrics) keeps only those. Views
# of one slab would keep every image of every batch alive instead (measured: +163 MiB for
# 25 KiB of labels, and the workers kept creating slabs). So a leaf of at most
# ``SMALL_LEAF_BYTES`` is copied out of the slab into ordinary memory, as long as the copies
# of a batch stay within an eighth of its bytes: copying costs little next to the batch, and
# what stays a view is large enough to be worth its slab. A batch made only of small leaves
# lets go of its slab at once.
SMALL_LEAF_BYTES = 256 << 10
_COPY_SHARE = 8  # a batch's copies stay within 1/_COPY_SHARE of its bytes (or one small leaf)


class _LeaseUnpickler(pickle.Unpickler):
    def __init__(self, payload: bytes, lease: ctypes.Array | None, used: int = 0) -> None:
        super().__init__(io.BytesIO(payload))
        self._lease = lease
        self._bytes: dict[int, bytes] = {}  # offset -> the bytes object made from it
        self._copy_budget = max(used // _COPY_SHARE, SMALL_LEAF_BYTES if used <= SMALL_LEAF_BYTES
                                else 0)

    def _copies(self, nbytes: int) -> bool:
        """NOTE [ Small leaves do not hold the slab ]: copy this leaf out of the slab?"""
        if nbytes > SMALL_LEAF_BYTES or nbytes > self._copy_budget:
            return False
        self._copy_budget -= nbytes
        return True

    def load(self) -> Any:
        try:
            return super().load()
        finally:
            # Rebuilding a sparse tensor parks it in torch's list of tensors to validate, which
            # torch.load empties; left there, each such batch (and its slab) lived forever.
            if torch._utils._sparse_tensors_to_validate:
                torch._utils._validate_loaded_sparse_tensors()

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "e":
            _, dtype, shape, requires_grad = pid
            return torch.empty(shape, dtype=dtype, requires_grad=requires_grad)
        if pid[0] == "ea":
            return np.empty(pid[2], dtype=pid[1])
        if pid[0] == "b":  # NOTE [ Encoded bytes through the slab ]
            _, offset, nbytes = pid
            made = self._bytes.get(offset)
            if made is None:
                assert self._lease is not None
                made = self._bytes[offset] = bytes(memoryview(self._lease)[offset:offset + nbytes])
            return made
        if pid[0] == "t":
            _, offset, dtype, shape, stride, requires_grad = pid
            numel = 1
            for s in shape:
                numel *= s
            flat = torch.frombuffer(self._lease, dtype=dtype, count=numel, offset=offset)
            t = flat.as_strided(shape, stride) if stride is not None else flat.view(shape)
            if self._copies(numel * flat.element_size()):
                t = t.clone()
            return t.requires_grad_() if requires_grad else t
        _, offset, dtype, shape = pid
        count = int(np.prod(shape, dtype=np.int64))
        lease: Any = self._lease
        array = np.frombuffer(lease, dtype=dtype, count=count, offset=offset).reshape(shape)
        return array.copy() if self._copies(array.nbytes) else array


class _Slab:
    """One worker slab as the main process sees it. At most one lease at a time: the worker
    writes into a slab again only after its lease was released."""

    __slots__ = ("fd", "nbytes", "address", "leased", "retired", "bank", "pins")

    def __init__(self, fd: int | None, nbytes: int) -> None:
        self.fd = fd  # None for a banked slab: only its mapping is left
        self.nbytes = nbytes
        self.address: int | None = None
        self.leased = False
        self.retired = False
        self.bank: tuple[SlabBank, int] | None = None  # (bank, worker id) once its lease ends
        self.pins: HostPinner | None = None  # who page-locked the mapping, if anyone

    def unpin(self) -> None:
        if self.pins is not None and self.address is not None:
            pins, self.pins = self.pins, None
            pins.unpin(self.address)

    def unmap(self) -> None:
        if self.address is not None:
            self.unpin()
            address, self.address = self.address, None
            segments.unmap_address(address, self.nbytes)


class SlabReader:
    """Maps the slabs of every worker of one iterator and tracks which the user still holds."""

    def __init__(self) -> None:
        self._slabs: dict[tuple[int, int], _Slab] = {}
        # Appended to from finalizers (any thread, any time); drained by the iterator.
        self.released: collections.deque[tuple[int, int]] = collections.deque()
        # Finalizers run on any thread, or re-entrantly inside these methods when a collection
        # happens there; the lock is re-entrant and each check-and-set in it allocates nothing.
        self._lock = threading.RLock()
        self.pins: HostPinner | None = None  # NOTE [ Slabs pinned in place ]

    def adopt(self, worker_id: int, ref: SegmentRef, fd: int | None) -> None:
        fd = segments.open_received(ref, fd)
        self._slabs[(worker_id, ref.segment_id)] = _Slab(fd, ref.nbytes)

    def adopt_banked(self, worker_id: int, segment_id: int, banked: BankedSlab) -> None:
        """A slab an earlier worker left, handed to worker ``worker_id`` as ``segment_id``:
        mapped here already, and with no fd (NOTE [ Slabs outlive workers ])."""
        slab = _Slab(None, banked.nbytes)
        slab.address = banked.address
        self._slabs[(worker_id, segment_id)] = slab

    def _close_fd(self, slab: _Slab) -> None:
        if slab.fd is not None:
            fd, slab.fd = slab.fd, None
            segments.close(fd)

    def _retire(self, slab: _Slab) -> None:
        self._close_fd(slab)
        with self._lock:
            slab.retired = True
            if not slab.leased:
                slab.unmap()

    def retire(self, worker_id: int, segment_ids: list[int]) -> None:
        for sid in segment_ids:
            slab = self._slabs.pop((worker_id, sid), None)
            if slab is not None:
                self._retire(slab)

    def _released(self, key: tuple[int, int], slab: _Slab) -> None:
        with self._lock:
            slab.leased = False
            if slab.bank is not None and slab.address is not None:
                # The workers stopped while the user held this batch: bank it now.
                (bank, wid), slab.bank = slab.bank, None
                slab.unpin()
                address, slab.address = slab.address, None
                bank.deposit(wid, BankedSlab(address, slab.nbytes))
            elif slab.retired:
                slab.unmap()
            else:
                self.released.append(key)

    def unpack(self, worker_id: int, segment_id: int | None, used: int, payload: bytes) -> Any:
        if segment_id is None:  # nothing in shared memory (empty tensors at most)
            return _LeaseUnpickler(payload, None).load()
        key = (worker_id, segment_id)
        slab = self._slabs[key]
        if slab.address is None:
            assert slab.fd is not None, "a banked slab keeps its mapping"
            slab.address = segments.map_address(slab.fd, slab.nbytes)
            self._close_fd(slab)  # the mapping keeps the memory: no fd per batch held
        if self.pins is not None and slab.pins is None:
            self.pins.pin(slab.address, slab.nbytes)
            slab.pins = self.pins
        slab.leased = True
        lease = segments.lease_at(slab.address, used, functools.partial(self._released, key, slab))
        return _LeaseUnpickler(payload, lease, used).load()

    def release_now(self, worker_id: int, segment_id: int | None) -> None:
        """For batches dropped unread (stale epoch, shutdown): the slab is free at once."""
        if segment_id is not None:
            self.released.append((worker_id, segment_id))

    def nbytes(self, worker_id: int, segment_id: int) -> int:
        slab = self._slabs.get((worker_id, segment_id))
        return slab.nbytes if slab is not None else 0

    def take_released(self) -> dict[int, list[int]]:
        keys = []
        while self.released:
            keys.append(self.released.popleft())
        if self.pins is not None:
            keys = self.pins.gate(keys)
        by_worker: dict[int, list[int]] = {}
        for wid, sid in keys:
            by_worker.setdefault(wid, []).append(sid)
        return by_worker

    def close(self, bank: SlabBank | None = None) -> None:
        """Retire every slab; with a ``bank``, they go there instead, a leased one when the
        user lets go of its batch (NOTE [ Slabs outlive workers ])."""
        for (wid, _), slab in self._slabs.items():
            if bank is None or not self._to_bank(slab, bank, wid):
                self._retire(slab)
        self._slabs.clear()
        self.released.clear()

    def _to_bank(self, slab: _Slab, bank: SlabBank, worker_id: int) -> bool:
        """Give a mapped slab to the bank (a leased one on release); False: retire it."""
        with self._lock:
            if slab.retired or slab.address is None:
                return False
            self._close_fd(slab)  # the mapping alone keeps the memory
            slab.retired = True  # the bank owns it (now or on release); this reader forgets it
            if slab.leased:
                slab.bank = (bank, worker_id)
                return True
            slab.unpin()
            address, slab.address = slab.address, None
        bank.deposit(worker_id, BankedSlab(address, slab.nbytes))
        return True
