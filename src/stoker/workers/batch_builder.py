"""A worker's batches into shared memory: collate into a slab from its pool, pack, reply.

The worker's main loop (``workers.main_loop``) fetches; this part owns the slab pool and
the replies that carry a batch (``Done``) or its error (``Failed``), with the slab ids the
worker retired since its last reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from stoker._core.specs import WorkerSpec
from stoker.collate import allocating_into
from stoker.errors import MixedDeviceError
from stoker.fetch.fetchers import EMPTY
from stoker.transport import segments
from stoker.transport.segments import SegmentRef
from stoker.transport.slab_writer import SlabPool, SlabWriter, batch_nbytes, write_batch
from stoker.workers import protocol as msg
from stoker.workers.remote_errors import capture, describe_indices


class Collated:
    """A batch that is already collated (vectorised fetch): it is only packed."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


class Packed(NamedTuple):
    """A batch in its slab, ready to be announced."""

    segment_id: int | None
    used: int
    payload: bytes
    collate_s: float
    pack_s: float
    packed_at: float


class BatchBuilder:
    """The slab pool and the replies of one worker; the only sender of ``Done``/``Failed``."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.worker_id = spec.worker_id
        self.conn = conn
        self.pool = SlabPool(self._announce, spec.max_idle_slabs, spec.slabs)
        self.retired: list[int] = []  # slab ids closed since the last reply

    def _announce(self, fd: int, ref: SegmentRef) -> None:
        msg.send(self.conn, msg.Slab(ref))
        if ref.name is None:
            segments.send_fd(self.conn, fd)

    def free(self, released: list[int]) -> None:
        """Slabs the main process gave back."""
        self.retired += self.pool.release(released)

    def slab_for(self, data: Any, read_waiting: Callable[[], object] | None) -> SlabWriter:
        """A slab for ``data``; OSError when none can be had. ``read_waiting`` reads the
        socket first when no slab is free (NOTE [ Slabs come back before the next task ])."""
        # Before the first batch the pool cannot know the size: measure the samples, so
        # the batch is collated straight into a slab that fits instead of being copied.
        hint = None if self.pool.sized or data is EMPTY else batch_nbytes(
            data.batch if isinstance(data, Collated) else data
        )
        if read_waiting is not None and not self.pool.has_free(hint):
            read_waiting()
        return self.pool.acquire(hint)

    def pack(self, slab: SlabWriter, data: Any, finish: Callable[[Any], Any]) -> Packed:
        """Collate ``data`` (with ``finish``) into ``slab`` and pack it; on an error the slab
        goes back and the error is raised."""
        try:
            t0 = time.perf_counter()
            with allocating_into(slab):
                batch = data.batch if isinstance(data, Collated) else finish(data)
            del data
            t1 = time.perf_counter()
            segment_id, used, payload = write_batch(self.pool, slab, batch)
            t2 = time.perf_counter()
        except Exception:
            self.pool.release_one(slab)
            raise
        return Packed(segment_id, used, payload, t1 - t0, t2 - t1, t2)

    def done(self, epoch: int, task_id: int, packed: Packed, skipped: list,
             report: msg.BatchReport, rngs: Any = None) -> None:
        msg.send(self.conn, msg.Done(
            epoch, task_id, packed.segment_id, packed.used, packed.payload, self.retired,
            skipped, report, rngs,
        ))
        self.retired = []

    def failed(self, epoch: int, task_id: int, indices: Any, exc: BaseException,
               rngs: Any = None) -> None:
        if isinstance(exc, MixedDeviceError) and isinstance(indices, list):
            exc = exc.with_indices(indices)
        err = capture(exc, self.worker_id, "loading " + describe_indices(indices))
        msg.send(self.conn, msg.Failed(epoch, task_id, err, rngs))
