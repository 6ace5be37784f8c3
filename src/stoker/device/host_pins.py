"""Slabs page-locked in place: ``pin_memory=True`` (and ``device=``) without a copy per batch.

NOTE [ Slabs pinned in place ]
torch's pin thread copies every batch from shared memory into a fresh pinned buffer: a second
full copy of the data on the CPU. stoker's batches already live in slabs that are mapped once
and reused (NOTE [ Slab lifecycle ]), so each slab mapping is registered with the CUDA driver
once (``cudaHostRegister``, page-locked where it is) the first time a batch is read from it,
and unregistered just before it is unmapped or handed to the slab bank. The batch's tensors
then report ``is_pinned()`` and copies from them are asynchronous, with no copy on the host.
Memory stays bounded: only the slabs the engine keeps anyway are registered. Tensors of a
batch that do not live in a slab (empty ones, or a batch sent without shared memory) are
pinned the torch way, by copying; so is everything when the driver refuses to register (said
once, with its reason, on the ``stoker.device.host_pins`` logger: batches are right either way,
so not through ``warnings``, NOTE [ torch's voice ] in ``_core/torch_voice.py``).

What torch's pinned buffers get from its caching host allocator, a registered slab needs from
us: it must not be written again (a worker collating the next batch into it), unregistered or
unmapped while a copy the user queued still reads it. A user's ``batch.to(device,
non_blocking=True)`` tells us nothing, so:

* a released slab goes back to its worker only once an event recorded on the current CUDA
  stream of the iterating thread *after* the release has completed (``gate``): every copy the
  loop queued on that stream, or on a stream it has joined (``wait_stream``/``wait_event``, as
  every prefetcher must before using the data) was queued before, so it has finished. A copy
  on a stream the iterating thread's stream never waits for, and never synchronised, is not
  covered: that loop consumes data it has not waited for, which is unsafe already.
* unregistering waits for the whole device (``synchronize``) first: it happens when slabs are
  retired or an iterator shuts down, not per batch.

With ``device=`` stoker queues the copies itself (``feed``): it keeps each host batch until
its copy's event completed, so ``gate`` lets slabs through at once and ``unpin`` waits only
for the last copy stoker queued from that slab.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import torch

from stoker.device.backend import DeviceBackend, Event

log = logging.getLogger(__name__)
_told_refusal = False
_told_lock = threading.Lock()


def _tell_refusal(why: str) -> None:
    global _told_refusal
    with _told_lock:
        if _told_refusal:
            return
        _told_refusal = True
    log.warning(
        "stoker: could not page-lock its shared-memory slabs in place (%s), so "
        "pin_memory=True copies each batch into pinned memory as torch's DataLoader does (a "
        "second copy of every batch on the CPU). Registering host memory can be refused in "
        "containers limiting locked memory, or under a driver without host registration; "
        "batches are correct either way.", why,
    )


def storage_address(tensor: torch.Tensor) -> int:
    """Where a tensor's memory block starts: for a tensor read from a slab, the byte of the
    slab where its leaf begins (``torch.frombuffer`` at an offset starts the storage there),
    so only a batch's first leaf starts where the slab does."""
    return int(tensor.untyped_storage().data_ptr())


class HostPins:
    """The slab mappings of one iterator registered with the driver; see NOTE [ Slabs pinned
    in place ]. ``user_copies``: the loop queues its own copies (``pin_memory=True`` alone)."""

    def __init__(self, backend: DeviceBackend, user_copies: bool) -> None:
        self._backend = backend
        self._user_copies = user_copies
        self._spans: dict[int, int] = {}  # registered address -> bytes
        self._last_copy: dict[int, Event] = {}  # address -> event of stoker's last copy from it
        self._held: collections.deque[tuple[Event, list[Any]]] = collections.deque()
        self.refused: str | None = None
        # unpin runs from lease finalizers (any thread, or re-entrantly): dict ops only.
        self._lock = threading.RLock()

    @property
    def registered_bytes(self) -> int:
        return sum(self._spans.values())

    def pin(self, address: int, nbytes: int) -> None:
        if self.refused is not None or address in self._spans:
            return
        why = self._backend.host_register(address, nbytes)
        if why is not None:
            self.refused = why
            _tell_refusal(why)
            return
        with self._lock:
            self._spans[address] = nbytes

    def _slab_of(self, tensor: torch.Tensor) -> int | None:
        """The registered slab ``tensor``'s storage lies in (by range: a leaf after the first
        starts inside its slab), or None. A handful of slabs per worker: a scan is enough."""
        start = storage_address(tensor)
        end = start + tensor.untyped_storage().nbytes()
        with self._lock:
            for address, nbytes in self._spans.items():
                if address <= start and end <= address + nbytes:
                    return address
        return None

    def covers(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lives in a registered slab (so it is pinned already)."""
        return self._slab_of(tensor) is not None

    def note_copy(self, tensor: torch.Tensor, event: Event) -> None:
        """stoker queued a copy from ``tensor``; ``event`` completes after it."""
        address = self._slab_of(tensor)
        if address is not None:
            self._last_copy[address] = event

    def unpin(self, address: int) -> None:
        with self._lock:
            nbytes = self._spans.pop(address, None)
            event = self._last_copy.pop(address, None)
        if nbytes is None:
            return
        if self._user_copies:
            self._backend.synchronize()  # a copy the loop queued may read it, on any stream
        elif event is not None:
            event.synchronize()
        self._backend.host_unregister(address)

    def gate(self, keys: list[Any]) -> list[Any]:
        if not self._user_copies or (not self._spans and not self._held):
            return keys
        if keys:
            event = self._backend.new_event()
            event.record(self._backend.current_stream())
            self._held.append((event, keys))
        ready: list[Any] = []
        while self._held and self._held[0][0].query():
            ready.extend(self._held.popleft()[1])
        return ready

    def held(self) -> int:
        """Released slabs waiting for their event (for tests and stats)."""
        return sum(len(keys) for _, keys in self._held)
