"""Protocols that let executors and collate write into a transport without importing it.

NOTE [ Collating into shared memory ]
A worker wants its batch tensors to be born inside a shared-memory slab, so that the only
thing crossing the pipe is a small descriptor. The collate layer asks the *current allocator*
(set by the executor for the duration of one batch, see ``stoker.collate.allocating_into``) for
an output tensor before stacking. The allocator may answer ``None`` (slab full, dtype it cannot
hold): collate then allocates normally and the transport copies the tensor in afterwards.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Allocator(Protocol):
    """Hands out uninitialised CPU tensors backed by transport-owned memory."""

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any | None:
        """A contiguous ``torch.Tensor`` of ``shape``/``dtype``, or ``None`` if it cannot."""
        ...


@runtime_checkable
class HostPinner(Protocol):
    """Page-locks the slabs a transport maps (NOTE [ Slabs pinned in place ] in
    ``stoker.device.host_pins``), and says when a released slab may be written again."""

    def pin(self, address: int, nbytes: int) -> None:
        """Register a mapping; a refusal is remembered (and told once), not raised."""
        ...

    def unpin(self, address: int) -> None:
        """Undo ``pin`` before the mapping goes away, once no copy reads from it."""
        ...

    def gate(self, keys: list[Any]) -> list[Any]:
        """Of the slabs released so far (``keys``, plus any held back before), those no
        device copy can still be reading; the others are held back."""
        ...
