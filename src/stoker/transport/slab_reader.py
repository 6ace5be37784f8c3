"""Main-process side of the transport: turn a packed batch back into tensors over shared memory.

NOTE [ Slab lifecycle ]
1. A worker creates a slab (``segments.create``) and announces it; the main process adopts the
   fd (``SlabReader.adopt``). Both keep the fd until the slab is retired.
2. The worker collates a batch into a free slab and sends (segment id, bytes used, payload).
3. ``SlabReader.unpack`` maps those bytes afresh (one mapping per batch: the *lease*) and
   rebuilds every tensor and array as a view of the lease. The user's tensors hold the lease
   alive; nothing is copied.
4. When the last tensor of the batch dies, the lease is collected and a finalizer queues
   (worker id, segment id) on ``released``. The iterator sends these ids back with the worker's
   next task and only then does the worker write into that slab again. A batch the user keeps
   forever simply keeps its slab; the worker makes a new one.
5. Retired slabs (too many idle) are closed on both sides; at shutdown every fd is closed.
   Leases still held by the user stay valid: a mapping outlives its fd.
"""

from __future__ import annotations

import collections
import ctypes
import io
import pickle
from typing import Any

import numpy as np
import torch

from stoker.transport import segments
from stoker.transport.segments import SegmentRef


class _LeaseUnpickler(pickle.Unpickler):
    def __init__(self, payload: bytes, lease: ctypes.Array | None) -> None:
        super().__init__(io.BytesIO(payload))
        self._lease = lease

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "e":
            _, dtype, shape, requires_grad = pid
            return torch.empty(shape, dtype=dtype, requires_grad=requires_grad)
        if pid[0] == "ea":
            return np.empty(pid[2], dtype=pid[1])
        if pid[0] == "t":
            _, offset, dtype, shape, stride, requires_grad = pid
            numel = 1
            for s in shape:
                numel *= s
            flat = torch.frombuffer(self._lease, dtype=dtype, count=numel, offset=offset)
            t = flat.as_strided(shape, stride) if stride is not None else flat.view(shape)
            return t.requires_grad_() if requires_grad else t
        _, offset, dtype, shape = pid
        count = int(np.prod(shape, dtype=np.int64))
        lease: Any = self._lease
        return np.frombuffer(lease, dtype=dtype, count=count, offset=offset).reshape(shape)


class SlabReader:
    """Maps the slabs of every worker of one iterator and tracks which the user still holds."""

    def __init__(self) -> None:
        self._fds: dict[tuple[int, int], int] = {}
        # Appended to from finalizers (any thread, any time); drained by the iterator.
        self.released: collections.deque[tuple[int, int]] = collections.deque()

    def adopt(self, worker_id: int, ref: SegmentRef, fd: int | None) -> None:
        self._fds[(worker_id, ref.segment_id)] = segments.open_received(ref, fd)

    def retire(self, worker_id: int, segment_ids: list[int]) -> None:
        for sid in segment_ids:
            fd = self._fds.pop((worker_id, sid), None)
            if fd is not None:
                segments.close(fd)

    def unpack(self, worker_id: int, segment_id: int | None, used: int, payload: bytes) -> Any:
        if segment_id is None:  # nothing in shared memory (empty tensors at most)
            return _LeaseUnpickler(payload, None).load()
        fd = self._fds[(worker_id, segment_id)]
        key = (worker_id, segment_id)
        lease = segments.map_lease(fd, used, lambda: self.released.append(key))
        return _LeaseUnpickler(payload, lease).load()

    def release_now(self, worker_id: int, segment_id: int | None) -> None:
        """For batches dropped unread (stale epoch, shutdown): the slab is free at once."""
        if segment_id is not None:
            self.released.append((worker_id, segment_id))

    def take_released(self) -> dict[int, list[int]]:
        by_worker: dict[int, list[int]] = {}
        while self.released:
            wid, sid = self.released.popleft()
            by_worker.setdefault(wid, []).append(sid)
        return by_worker

    def close(self) -> None:
        for fd in self._fds.values():
            segments.close(fd)
        self._fds.clear()
        self.released.clear()
