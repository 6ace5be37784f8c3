"""Worker side of the transport: slabs that batches are collated into, and a pool that reuses them.

A slab is one shared-memory segment holding one batch at a time. Collate allocates its output
tensors from the slab (``SlabWriter.empty``, the ``Allocator`` protocol); ``pack`` then pickles
the batch with every tensor and numpy array replaced by a descriptor (offset, dtype, shape), so
the bytes that cross the pipe are a few hundred no matter how large the batch. A tensor that was
not born in the slab is copied in once. See NOTE [ Slab lifecycle ] in ``slab_reader``.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stoker.transport import segments
from stoker.transport.segments import SegmentRef

_ALIGN = 64
_MIN_SLAB_BYTES = 1 << 16
# Slack over the batch a slab is sized for. Every byte of a slab is memory (it is mapped with
# MAP_POPULATE), and most loaders' batches all have one size, so slabs start nearly exact; once
# a batch did not fit (sizes vary), new slabs get room for the next larger one too.
_TIGHT_HEADROOM = 1.0625
_HEADROOM = 1.25

# NOTE [ Encoded bytes through the slab ]
# A batch of encoded images or audio (a list of ``bytes``, what ``default_collate`` makes of
# them) would otherwise travel inside the pickled message: 15 MB a batch of 256 JPEGs, read
# from the worker's socket in chunks, joined and unpickled, several copies of fresh memory on
# the main thread (measured: 20-30 ms a batch on this project's CPU machine). Each ``bytes``
# object of at least ``SLAB_BYTES_MIN`` is written into the slab instead and the main process
# makes the ``bytes`` object from there: one copy, and the message stays small. What arrives is
# what torch's would be: ``bytes`` objects, equal, one object for one object (the slab only
# carries them, the lease is not held by them).
SLAB_BYTES_MIN = 4096


class SlabFull(Exception):
    """Raised while packing when the slab cannot hold the batch."""


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def _sendable_tensor(t: torch.Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_nested  # strided layout too, but no single buffer: pickled instead
        and not t.is_quantized
        and (t.grad_fn is None)
    )


def _dense(t: torch.Tensor) -> bool:
    """True if ``t`` covers exactly ``numel`` elements in some dimension order (a permutation)."""
    expected = 1
    for d in sorted(range(t.dim()), key=t.stride):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _sendable_array(a: np.ndarray) -> bool:
    return not a.dtype.hasobject


class SlabWriter:
    """One slab: a bump allocator over a shared mapping, reset for every batch."""

    def __init__(self, ref: SegmentRef, address: int) -> None:
        """The shared mapping of segment ``ref`` at ``address``: mapped by this process, or
        inherited (NOTE [ Slabs outlive workers ]). It holds no file descriptor, so a user
        keeping thousands of batches does not run the worker out of them."""
        self.ref = ref
        self.capacity = ref.nbytes
        self._address = address
        self._mm = (ctypes.c_ubyte * ref.nbytes).from_address(address)
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._base = self._bytes.data_ptr()
        self.cursor = 0

    @property
    def segment_id(self) -> int:
        return self.ref.segment_id

    def empty(self, shape: tuple[int, ...], dtype: Any) -> torch.Tensor | None:
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        if numel == 0 or self.cursor + nbytes > self.capacity:
            return None
        start = self.cursor
        self.cursor = _aligned(start + nbytes)
        return self._bytes[start : start + nbytes].view(dtype).view(shape)

    def offset_of(self, t: torch.Tensor) -> int | None:
        """Offset of ``t``'s data in this slab, if it lies wholly inside and is contiguous."""
        start = t.data_ptr() - self._base
        if 0 <= start and start + t.numel() * t.element_size() <= self.capacity:
            return start if t.is_contiguous() else None
        return None

    def close(self) -> None:
        del self._bytes
        del self._mm
        segments.unmap_address(self._address, self.capacity)


def _explained(exc: OSError, nbytes: int) -> OSError:
    """The OS refused a new slab: the same error, saying why and what to change."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            open_now = f"has {len(os.listdir('/proc/self/fd')) - 1} files open and "
        except OSError:  # listing them needs a file descriptor too
            open_now = ""
        hint = (
            f"this worker {open_now}may have at most {soft} open. stoker keeps no file "
            "descriptor per batch, so files the dataset opens are the likely cause: open them "
            "once per worker and close those done with; or raise the limit (`ulimit -n` in the "
            "shell, resource.setrlimit(resource.RLIMIT_NOFILE, ...) in Python). torch's other "
            "remedy, torch.multiprocessing.set_sharing_strategy('file_system'), does not apply "
            "to stoker."
        )
    elif exc.errno in (errno.ENOMEM, errno.ENOSPC):
        hint = ("the machine (or the container's memory limit) has no room for it; lower "
                "batch_size, prefetch_factor or num_workers")
    else:
        return exc
    return OSError(exc.errno, f"creating a {nbytes}-byte shared-memory slab for a batch "
                              f"failed ({exc.strerror}): {hint}")


class _PackingPickler(pickle.Pickler):
    """Pickles a batch, swapping tensors and arrays for descriptors of their place in the slab."""

    def __init__(self, file: io.BytesIO, slab: SlabWriter) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._slab = slab
        self._placed: dict[int, tuple] = {}  # id of a bytes object -> its descriptor

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is torch.Tensor and _sendable_tensor(obj):
            return self._tensor_ref(obj)
        if kind is np.ndarray and _sendable_array(obj):
            return self._array_ref(obj)
        if kind is bytes and len(obj) >= SLAB_BYTES_MIN:
            return self._bytes_ref(obj)
        return None

    def _tensor_ref(self, t: torch.Tensor) -> tuple:
        if t.numel() == 0:
            # No bytes to place; also, torch 2.13 cannot unpickle empty uint16/32/64 tensors.
            return ("e", t.dtype, tuple(t.shape), t.requires_grad)
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        offset = self._slab.offset_of(t)
        stride = None
        if offset is None:
            flat = self._slab.empty((t.numel(),), t.dtype)
            if flat is None:
                raise SlabFull
            if not t.is_contiguous() and _dense(t):
                stride = t.stride()
                flat.as_strided(t.shape, stride).copy_(t)
            else:
                flat.view(t.shape).copy_(t)
            offset = flat.data_ptr() - self._slab._base
        return ("t", offset, t.dtype, tuple(t.shape), stride, t.requires_grad)

    def _array_ref(self, a: np.ndarray) -> tuple:
        if a.size == 0:
            return ("ea", a.dtype, a.shape)
        flat = self._slab.empty((a.nbytes,), torch.uint8)
        if flat is None:
            raise SlabFull
        np.copyto(flat.numpy().view(a.dtype).reshape(a.shape), a, casting="no")
        return ("a", flat.data_ptr() - self._slab._base, a.dtype, a.shape)

    def _bytes_ref(self, b: bytes) -> tuple:
        """NOTE [ Encoded bytes through the slab ]: placed once per object (the same object
        twice in a batch arrives as one object, as pickle's memo makes it)."""
        ref = self._placed.get(id(b))
        if ref is None:
            flat = self._slab.empty((len(b),), torch.uint8)
            if flat is None:
                raise SlabFull
            flat.numpy()[:] = np.frombuffer(b, dtype=np.uint8)
            ref = self._placed[id(b)] = ("b", flat.data_ptr() - self._slab._base, len(b))
        return ref


class _SizingPickler(pickle.Pickler):
    """Adds up the slab bytes a batch needs, without copying anything."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.nbytes = 0

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is torch.Tensor and _sendable_tensor(obj):
            self.nbytes += _aligned(obj.numel() * obj.element_size())
            return 0
        if kind is np.ndarray and _sendable_array(obj):
            self.nbytes += _aligned(obj.nbytes)
            return 0
        if kind is bytes and len(obj) >= SLAB_BYTES_MIN:
            self.nbytes += _aligned(len(obj))  # (an object met twice is counted twice: room)
            return 0
        return None  # (empty ones add 0 bytes)


def batch_nbytes(batch: Any) -> int:
    sizer = _SizingPickler(io.BytesIO())
    sizer.dump(batch)
    return sizer.nbytes


def pack_into(slab: SlabWriter, batch: Any) -> bytes:
    """Pickle ``batch`` with its tensors in ``slab``; raises ``SlabFull`` if it does not fit."""
    buf = io.BytesIO()
    with torch.no_grad():
        _PackingPickler(buf, slab).dump(batch)
    return buf.getvalue()


class SlabPool:
    """A worker's slabs: reuse the ones the main process has released, create more as needed.

    ``announce(fd, ref)`` is called for every new slab, before any batch in it is sent, so the
    main process can map it (the worker loop sends the fd over its socket).
    """

    def __init__(
        self,
        announce: Callable[[int, SegmentRef], None],
        max_idle: int,
        inherited: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self._announce = announce
        self._max_idle = max(1, max_idle)
        self._slabs: dict[int, SlabWriter] = {}
        self._free: list[int] = []
        self._expected = _MIN_SLAB_BYTES
        self._headroom = _TIGHT_HEADROOM
        # Slabs an earlier worker left, as (address, nbytes) of mappings inherited from the
        # main process (NOTE [ Slabs outlive workers ]): ids 0..k-1, which the main process
        # already knows, so they are not announced.
        for sid, (address, nbytes) in enumerate(inherited):
            self._slabs[sid] = SlabWriter(SegmentRef(sid, nbytes, None), address)
            self._free.append(sid)
        self._next_id = len(inherited)

    def _need(self, nbytes: int | None) -> int:
        """Bytes a batch of ``nbytes`` needs (unknown: the size batches had)."""
        return max(nbytes or 0, self._expected)

    def _fitting(self, need: int) -> list[int]:
        return [sid for sid in self._free if self._slabs[sid].capacity >= need]

    def has_free(self, nbytes: int | None = None) -> bool:
        """Whether ``acquire(nbytes)`` would reuse a slab instead of creating one."""
        return bool(self._fitting(self._need(nbytes)))

    def acquire(self, nbytes: int | None = None) -> SlabWriter:
        need = self._need(nbytes)
        fits = self._fitting(need)
        if fits:
            sid = min(fits, key=lambda s: self._slabs[s].capacity)
            self._free.remove(sid)
            slab = self._slabs[sid]
        else:
            slab = self._create(int(need * self._headroom))
        slab.cursor = 0
        return slab

    def _create(self, nbytes: int) -> SlabWriter:
        try:
            fd, ref = segments.create(self._next_id, max(nbytes, _MIN_SLAB_BYTES))
            try:
                address = segments.map_address(fd, ref.nbytes)
            except OSError:
                segments.close(fd)
                raise
        except OSError as exc:
            raise _explained(exc, nbytes) from None
        self._next_id += 1
        slab = SlabWriter(ref, address)
        try:
            self._announce(fd, ref)
        except BaseException:
            slab.close()
            raise
        finally:
            segments.close(fd)  # the mapping keeps the memory; the main process has its fd
        self._slabs[ref.segment_id] = slab
        return slab

    def outgrown(self) -> None:
        """A batch did not fit its slab: batch sizes vary, so size new slabs with room."""
        self._headroom = _HEADROOM

    @property
    def sized(self) -> bool:
        """Whether a batch has taught the pool how big batches are."""
        return self._expected > _MIN_SLAB_BYTES

    def note_used(self, nbytes: int) -> None:
        """Remember how big batches are, so the next slab is sized right the first time."""
        self._expected = max(_MIN_SLAB_BYTES, nbytes)

    def release(self, segment_ids: list[int]) -> list[int]:
        """Return slabs to the pool; retire idle ones beyond the cap. Returns retired ids."""
        self._free.extend(sid for sid in segment_ids if sid in self._slabs)
        retired: list[int] = []
        while len(self._free) > self._max_idle:
            sid = min(self._free, key=lambda s: self._slabs[s].capacity)
            self._free.remove(sid)
            self._slabs.pop(sid).close()
            retired.append(sid)
        return retired

    def release_one(self, slab: SlabWriter) -> None:
        """Give back a slab that was acquired but not sent."""
        self._free.append(slab.segment_id)

    def close(self) -> None:
        for slab in self._slabs.values():
            slab.close()
        self._slabs.clear()
        self._free.clear()


def write_batch(pool: SlabPool, slab: SlabWriter, batch: Any) -> tuple[int | None, int, bytes]:
    """Pack a batch collated (partly) into ``slab``; returns (segment id or None, used, payload).

    If the batch does not fit, it goes into a slab sized for it. A batch with no tensors or
    arrays gives its slab straight back and travels as a plain pickle.
    """
    try:
        payload = pack_into(slab, batch)
    except SlabFull:
        # Acquire before giving the small slab back: the batch may still live in it.
        pool.outgrown()
        small, slab = slab, pool.acquire(batch_nbytes(batch))
        payload = pack_into(slab, batch)
        pool.release_one(small)
    used = slab.cursor
    if used == 0:
        pool.release_one(slab)
        return None, 0, payload
    pool.note_used(used)
    return slab.segment_id, used, payload


