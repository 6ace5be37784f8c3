"""``device=``: batches handed out on the GPU, copied on a side stream ahead of the loop.

NOTE [ Batches on the device ]
One ``DeviceFeed`` per iterator sits between the engine (host batches, in delivery order) and
the user. On each ``next()`` it first tops the window up to ``ahead + 1`` batches whose copies
are queued, then hands out the oldest:

1. *Queue a copy* (``_pull``): take the next host batch from the engine; on the feed's own
   stream, record ``start``, copy every CPU tensor with ``non_blocking=True`` (from a slab
   page-locked in place, NOTE [ Slabs pinned in place ], this returns at once), run the
   user's ``device_transform`` (uint8 -> float, normalize, channels_last, decode), record
   ``done``. The host batch is kept until ``done`` has completed: only then may its slab be
   released, written by a worker again or unmapped.
2. *Hand out* (``_hand_out``): the consumer's current stream (read at that ``next()``) waits
   for ``done`` (``Event.wait``: no host synchronize), and every device tensor of the batch
   is ``record_stream``-ed on it, so the caching allocator does not give its memory to a
   later copy on the feed's stream while the consumer still reads it. An event ``wanted``
   recorded on the consumer's stream just before the wait measures, once both completed,
   how long the consumer's stream waited for the copy (``device_wait_s``).
3. *Resume state*: pulling a host batch ahead would count it as delivered. The engine's
   delivery records (``_delivered``) are held back per batch and applied only when that batch
   is handed out, so ``state_dict()`` is that of the batches the user received; an error
   raised while pulling ahead is raised at its turn, after the batches before it.

Nothing here blocks on the device except ``reset``/``close`` (a new epoch on persistent
workers, or the end of the iterator), which wait for the copies they abandon before their
host batches go. Several loaders each have their own feed and stream.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from stoker.device.backend import DeviceBackend, Event, Stream
from stoker.device.tree import iter_tensors, map_batch
from stoker.errors import BatchDeviceError

_MAX_UNSETTLED = 256  # timing records kept waiting for their events, at most

# The per-batch seed of the batch a device_transform is running for (decode's random crops).
_BATCH = threading.local()


def current_batch_seed() -> int | None:
    """Seed of the batch whose ``device_transform`` runs in this thread, else None."""
    return getattr(_BATCH, "seed", None)


def current_batch_device() -> torch.device | None:
    """The device the feed running a ``device_transform`` in this thread copies to."""
    return getattr(_BATCH, "device", None)


@dataclass(frozen=True)
class FeedSpec:
    device: torch.device
    ahead: int  # batches whose copies are queued beyond the one handed out
    transform: Callable[[Any], Any] | None


class HostSource(Protocol):
    """The iterator, as the feed sees it."""

    def next_host(self) -> Any: ...

    def hold_deliveries(self) -> None: ...

    def release_deliveries(self) -> list[Any]: ...

    def apply_deliveries(self, deliveries: list[Any]) -> None: ...

    def seed_of(self, deliveries: list[Any]) -> int | None: ...


class _Entry:
    __slots__ = ("data", "error", "deliveries", "done", "start", "nbytes")

    def __init__(self, deliveries: list[Any]) -> None:
        self.deliveries = deliveries
        self.data: Any = None
        self.error: BaseException | None = None
        self.done: Event | None = None
        self.start: Event | None = None
        self.nbytes = 0


class DeviceFeed:
    """See NOTE [ Batches on the device ]."""

    def __init__(
        self, spec: FeedSpec, backend: DeviceBackend, source: HostSource, stats: Any,
        pins: Any = None,
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._source = source
        self._stats = stats
        self.pins = pins  # NOTE [ Slabs pinned in place ]; set once the slabs exist
        self._stream: Stream | None = None  # made at the first copy (CUDA starts then)
        self._window: collections.deque[_Entry] = collections.deque()
        self._hosts: collections.deque[tuple[Event, Any]] = collections.deque()
        self._timing: collections.deque[tuple[Event, Event, Event]] = collections.deque()
        self._tail: list[Any] = []  # deliveries pulled with the end of the epoch
        self._exhausted = False

    # -- the user's next() -------------------------------------------------------------------

    def next(self) -> Any:
        self._reap()
        self._settle()
        window = self._window
        # After a failed pull, nothing more until that error has been raised in its turn.
        while not self._exhausted and len(window) <= self._spec.ahead and not (
            window and window[-1].error is not None
        ):
            self._pull()
        if not self._window:
            tail, self._tail = self._tail, []
            self._source.apply_deliveries(tail)
            raise StopIteration
        return self._hand_out(self._window.popleft())

    def _pull(self) -> None:
        self._source.hold_deliveries()
        try:
            host = self._source.next_host()
        except StopIteration:
            self._exhausted = True
            self._tail = self._source.release_deliveries()
            return
        except Exception as exc:
            entry = _Entry(self._source.release_deliveries())
            entry.error = exc
            self._window.append(entry)
            return
        entry = _Entry(self._source.release_deliveries())
        t0 = time.perf_counter()
        try:
            self._queue_copy(entry, host)
        except Exception as exc:
            entry.data, entry.error = None, exc
        self._stats.to_device_s += time.perf_counter() - t0
        self._window.append(entry)

    def _queue_copy(self, entry: _Entry, host: Any) -> None:
        backend = self._backend
        if self._stream is None:
            self._stream = backend.new_stream()
        stream = self._stream
        copied: list[torch.Tensor] = []
        with backend.on_stream(stream):
            entry.start = backend.new_event()
            entry.start.record(stream)
            data = map_batch(host, lambda t: self._copy(t, copied),
                             lambda x: isinstance(x, torch.Tensor))
            if self._spec.transform is not None:
                _BATCH.seed = self._source.seed_of(entry.deliveries)
                _BATCH.device = self._spec.device
                t0 = time.perf_counter()
                try:
                    data = self._spec.transform(data)
                finally:
                    _BATCH.seed = _BATCH.device = None
                    self._stats.device_transform_s += time.perf_counter() - t0
            entry.done = backend.new_event()
            entry.done.record(stream)
        entry.data = data
        entry.nbytes = sum(t.numel() * t.element_size() for t in copied)
        if copied:
            if self.pins is not None:
                for t in copied:
                    self.pins.note_copy(t, entry.done)
            self._hosts.append((entry.done, host))  # its slabs stay ours until done

    def _copy(self, tensor: torch.Tensor, copied: list[torch.Tensor]) -> torch.Tensor:
        where = self._backend.where(tensor)
        if where == "host":
            copied.append(tensor)
            return self._backend.copy(tensor)
        if where == "device":
            # Made on the consumer's stream (num_workers=0): the copy stream must see it done.
            event = self._backend.new_event()
            event.record(self._backend.current_stream())
            assert self._stream is not None
            event.wait(self._stream)
            return tensor
        raise BatchDeviceError(
            f"DataLoader(device={str(self._spec.device)!r}) got a batch holding a tensor on "
            f"{tensor.device}; it moves CPU tensors to {self._spec.device} and passes tensors "
            "already there through, but will not move data between accelerators behind your back. "
            "Return CPU tensors from the dataset and collate_fn (the loader copies them), or "
            f"create them on {self._spec.device}."
        )

    def _hand_out(self, entry: _Entry) -> Any:
        self._source.apply_deliveries(entry.deliveries)
        if entry.error is not None:
            error, entry.error = entry.error, None
            raise error
        assert entry.done is not None and entry.start is not None
        backend = self._backend
        consumer = backend.current_stream()
        wanted = None
        if self._stats.measures and len(self._timing) < _MAX_UNSETTLED:
            wanted = backend.new_event()
            wanted.record(consumer)
        entry.done.wait(consumer)
        for _, t in iter_tensors(entry.data):
            if backend.where(t) == "device":
                backend.keep_until_used(t, consumer)
        self._stats.device_bytes += entry.nbytes
        self._stats.device_batches += 1
        if wanted is not None:
            self._timing.append((entry.start, entry.done, wanted))
        return entry.data

    # -- bookkeeping, without blocking -------------------------------------------------------

    def _reap(self) -> None:
        """Let go of host batches whose copies finished (their slabs may be reused)."""
        hosts = self._hosts
        while hosts and hosts[0][0].query():
            hosts.popleft()

    def _settle(self) -> None:
        """Add the device time of copies (and their waits) whose events completed."""
        timing = self._timing
        while timing:
            start, done, wanted = timing[0]
            if not (done.query() and wanted.query()):
                return
            timing.popleft()
            self._stats.device_copy_s += start.elapsed_s(done)
            self._stats.device_wait_s += max(0.0, wanted.elapsed_s(done))

    # -- epochs ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Abandon what was copied ahead (a new epoch before this one ended): wait for those
        copies, so the slabs they read are not written while the device reads them."""
        if self._hosts:
            self._hosts[-1][0].synchronize()  # one stream: the last completes last
        self._hosts.clear()
        self._window.clear()
        self._settle()
        self._timing.clear()
        self._tail = []
        self._exhausted = False

    close = reset
