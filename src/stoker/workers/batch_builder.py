"""A worker's batches into shared memory, and the replies that carry them.

By default a batch crosses as torch's workers send it: collated by the loader's own
``collate_fn`` (torch's ``default_collate`` allocates its outputs in shared memory inside a
worker) and pickled with ``ForkingPickler``, whose torch reductions give each storage its own
shared memory and keep views and aliasing as they are. With ``slab_transport`` (NOTE [ Same
as torch unless asked ]) the batch is collated straight into a slab from the worker's pool and
only descriptors are pickled (NOTE [ Slab lifecycle ] in ``transport.slab_reader``).

The worker's main loop (``workers.main_loop``) fetches; this part owns the slab pool and
the replies that carry a batch (``Done``) or its error (``Failed``), with the slab ids the
worker retired since its last reply, and the run-queue meter of the batch's report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from stoker._core.specs import WorkerSpec
from stoker._core.torch_modes import modes_active
from stoker.collate import allocating_into
from stoker.errors import MixedDeviceError
from stoker.fetch.fetchers import EMPTY
from stoker.transport import torch_way
from stoker.transport.reused_shm import WorkerSegments
from stoker.transport.segments import SegmentRef
from stoker.transport.slab_writer import SlabPool, SlabWriter, batch_nbytes, write_batch
from stoker.workers import feeder_stand_in
from stoker.workers import protocol as msg
from stoker.workers.remote_errors import capture, describe_failure


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
    nbytes: int  # the batch's tensor and array bytes (in the slab or not)
    fds: list[int]  # its storages' fds, to send after the reply (NOTE [ Batches cross as
    # torch's do ] in transport.torch_way); closed once sent
    reused: bool = False  # some storage goes by its segment's id (transport.reused_shm)


def _queued_s() -> float | None:
    """This thread's time runnable but not running (``/proc/thread-self/schedstat``, field 2),
    read as ``fetch.concurrency``'s ``SampleClock`` reads it; here, not called from there,
    so that a batch's path through a worker does not pass through the tuner's module."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class RunQueueMeter:
    """Time this thread spent runnable but not running (more threads than CPUs), for the
    ``BatchReport`` (``loader.stats()``). Read at most every ``every_s`` (a read costs ~10 us),
    so it also counts the queueing of collate and pack, and what accrues after a worker's last
    report is not counted; ``take()`` returns what accrued since its last read. Create it on
    the thread it measures."""

    def __init__(self, every_s: float = 0.1) -> None:
        self._every = every_s
        self._last = _queued_s()
        self._at = time.perf_counter()

    def take(self) -> float:
        now = time.perf_counter()
        if self._last is None or now - self._at < self._every:
            return 0.0
        value = _queued_s()
        if value is None:
            return 0.0
        delta, self._last, self._at = value - self._last, value, now
        return max(0.0, delta)


class BatchBuilder:
    """The slab pool and the replies of one worker; the only sender of ``Done``/``Failed``."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.worker_id = spec.worker_id
        self.conn = conn
        self.pool = SlabPool(self._announce, spec.max_idle_slabs, spec.slabs)
        self.retired: list[int] = []  # slab ids closed since the last reply
        self.slabs = "slab_transport" in spec.fetch.beyond
        # NOTE [ torch's shared memory, reused ]: torch's way, without its per-batch segments
        self.reuse = None if self.slabs or not spec.fetch.fast_paths else WorkerSegments()
        # Made on the worker's main thread, which fetches its batches one by one.
        self.run_queue = RunQueueMeter()

    def _announce(self, fd: int, ref: SegmentRef) -> None:
        msg.send(self.conn, msg.Slab(ref))
        if ref.name is None:
            msg.send_fd(self.conn, fd)

    def free(self, released: list[int], epoch_ended: bool = False) -> None:
        """Slabs (or, without slab_transport, reused segments) the main process gave back;
        at an epoch's end the free reused segments go too (the main process forgets them)."""
        if self.reuse is not None:
            self.reuse.release(released)
            if epoch_ended:
                self.reuse.drop_free()
        elif released:
            self.retired += self.pool.release(released)

    def slab_for(self, data: Any, read_waiting: Callable[[], object] | None
                 ) -> SlabWriter | None:
        """A slab for ``data`` (None without ``slab_transport``); OSError when none can be
        had. ``read_waiting`` reads the socket first when no slab is free (NOTE [ Slabs come
        back before the next task ])."""
        if not self.slabs:
            return None
        # Before the first batch the pool cannot know the size: measure the samples, so
        # the batch is collated straight into a slab that fits instead of being copied.
        hint = None if self.pool.sized or data is EMPTY else batch_nbytes(
            data.batch if isinstance(data, Collated) else data
        )
        if read_waiting is not None and not self.pool.has_free(hint):
            read_waiting()
        return self.pool.acquire(hint)

    def pack(self, slab: SlabWriter | None, data: Any, finish: Callable[[Any], Any]) -> Packed:
        """Collate ``data`` (with ``finish``) into ``slab`` and pack it; on an error the slab
        goes back and the error is raised. Without a slab: torch's way (module docstring)."""
        if slab is None:
            t0 = time.perf_counter()
            batch = data.batch if isinstance(data, Collated) else finish(data)
            del data
            t1 = time.perf_counter()
            reuse = self.reuse
            # an active torch mode (one the worker was forked with, or the program's
            # worker_init_fn set) sees only torch's pickling: NOTE [ The program's torch
            # modes see torch's calls ]
            chosen = reuse.prepare(batch) if reuse is not None and not modes_active() else {}
            reused = bool(chosen)
            try:
                payload, fds, nbytes = torch_way.dumps(batch, reuse, chosen)
            finally:
                if chosen and reuse is not None:  # not sent after all
                    reuse.unsent(chosen)
            t2 = time.perf_counter()
            return Packed(None, 0, payload, t1 - t0, t2 - t1, t2, nbytes, fds, reused)
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
        return Packed(segment_id, used, payload, t1 - t0, t2 - t1, t2, used, [])

    def done(self, epoch: int, task_id: int, packed: Packed, skipped: list,
             report: msg.BatchReport, rngs: Any = None) -> None:
        try:
            msg.send(self.conn, msg.Done(
                epoch, task_id, packed.segment_id, packed.used, packed.payload, self.retired,
                skipped, report, rngs, len(packed.fds), packed.reused,
            ))
            if packed.fds:
                msg.send_fds(self.conn, packed.fds)
        finally:
            torch_way.close(packed.fds)
        self.retired = []
        if self.reuse is not None and self.reuse.dropped:
            self.retired, self.reuse.dropped = self.reuse.dropped, []
        # NOTE [ torch's feeder thread in a worker ], [ torch's resource sharer in a worker ]
        feeder_stand_in.after_put(shared_fds=bool(packed.fds))

    def failed(self, epoch: int, task_id: int, indices: Any, exc: BaseException,
               rngs: Any = None) -> None:
        if isinstance(exc, MixedDeviceError) and isinstance(indices, list):
            exc = exc.with_indices(indices)
        err = capture(exc, self.worker_id, "loading " + describe_failure(indices, exc))
        msg.send(self.conn, msg.Failed(epoch, task_id, err, rngs))
        feeder_stand_in.after_put()
