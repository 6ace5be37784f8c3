"""Shared-memory segments: the only code in stoker that creates, maps or unlinks them.

A segment is an anonymous in-memory file. On Linux it is a ``memfd``: it has no name in
``/dev/shm``, is not limited by the size of ``/dev/shm`` (Docker's 64 MiB default), and the
kernel frees it when the last fd and mapping are gone, so a killed process cannot leak one.
Its fd crosses to the main process over the worker's Unix socket (SCM_RIGHTS, ``workers.protocol``'s
``send_fds``).

Elsewhere it is a POSIX ``shm_open`` segment whose name travels instead; the receiver opens it
and unlinks the name at once, so ``/dev/shm`` only holds it for that instant. Python's
``multiprocessing.resource_tracker`` is deliberately not involved: it would unlink segments the
other side still needs and warn about "leaked" ones at exit.

NOTE [ Inherited segment fds ]
Under ``fork`` a new worker inherits every fd of the main process, including the fds of slabs
owned by other loaders' workers. Holding them would keep that memory alive for the worker's
whole life, so a freshly forked worker closes every fd this module opened in its parent
(``close_inherited``).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from stoker._core.forked_copies import finalize_here

_HAS_MEMFD = hasattr(os, "memfd_create") and sys.platform.startswith("linux")
_PAGE = mmap.PAGESIZE

# fds this process holds for segments; see NOTE [ Inherited segment fds ].
_open_fds: set[int] = set()


@dataclass(frozen=True)
class SegmentRef:
    """How the receiving process finds a segment: an fd sent alongside, or a name."""

    segment_id: int
    nbytes: int
    name: str | None  # None: the fd travels over the socket (memfd)


def round_up(nbytes: int, to: int = _PAGE) -> int:
    return max(to, (nbytes + to - 1) // to * to)


def create(segment_id: int, nbytes: int) -> tuple[int, SegmentRef]:
    """Create a segment of at least ``nbytes``; returns its fd and the ref to send."""
    nbytes = round_up(nbytes)
    if _HAS_MEMFD:
        fd = os.memfd_create(f"stoker-slab-{segment_id}", os.MFD_CLOEXEC)
        name = None
    else:  # pragma: no cover - non-Linux fallback
        import _posixshmem

        name = f"/stoker-{os.getpid()}-{segment_id}-{os.urandom(4).hex()}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.close(fd)
        unlink(name)
        raise
    _open_fds.add(fd)
    return fd, SegmentRef(segment_id, nbytes, name)


def create_untracked(nbytes: int) -> int:
    """A segment of at least ``nbytes`` whose fd the caller owns: not in this module's
    registry, so a forked worker's ``close_inherited`` leaves it open, and nameless."""
    tracked_fd, ref = create(0, nbytes)
    try:
        return os.dup(tracked_fd)
    finally:
        close(tracked_fd)
        unlink(ref.name)


def create_log() -> int | None:
    """An anonymous in-memory file a worker's faulthandler writes its stacks to (Linux only).

    Its fd goes to the main process once, so a crashed or stuck worker's Python stacks can be
    read there even after the worker is gone.
    """
    if not _HAS_MEMFD:
        return None  # pragma: no cover
    fd = os.memfd_create("stoker-worker-stacks", os.MFD_CLOEXEC)
    _open_fds.add(fd)
    return fd


def read_log(fd: int, start: int = 0, limit: int = 1 << 16) -> str:
    """Text written to a log fd from ``start`` (at most ``limit`` bytes, the newest kept)."""
    size = os.fstat(fd).st_size
    begin = max(start, size - limit)
    return os.pread(fd, size - begin, begin).decode("utf-8", "replace")


def open_received_log(fd: int) -> None:
    """Track a log fd received from a worker, so forked children close it too."""
    _open_fds.add(fd)


def open_received(ref: SegmentRef, fd: int | None) -> int:
    """Adopt a segment another process created: the fd it sent, or open and unlink its name."""
    if ref.name is None:
        assert fd is not None, "a memfd segment needs the fd sent with it"
    else:  # pragma: no cover - non-Linux fallback
        import _posixshmem

        fd = _posixshmem.shm_open(ref.name, os.O_RDWR, mode=0o600)
        unlink(ref.name)
    _open_fds.add(fd)
    return fd


# Fault every page in at map time: one kernel pass instead of a fault per 4 KiB touched.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def map_segment(fd: int, nbytes: int) -> mmap.mmap:
    """A shared read-write mapping of the first ``nbytes`` of the segment."""
    flags = mmap.MAP_SHARED | _POPULATE
    return mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def map_private(fd: int, nbytes: int) -> mmap.mmap:
    """A copy-on-write mapping of the first ``nbytes``: this process's writes stay its own,
    pages it only reads stay shared with every other mapping of the segment."""
    return mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
)
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_address(fd: int, nbytes: int) -> int:
    """Map ``nbytes`` of a segment shared and read-write; returns the address (libc ``mmap``,
    so the mapping holds no fd). Undo with ``unmap_address``."""
    nbytes = round_up(nbytes)
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    address = _libc.mmap(None, nbytes, prot, mmap.MAP_SHARED | _POPULATE, fd, 0)
    if address is None or address == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of a {nbytes}-byte shared segment failed: {os.strerror(err)}")
    return int(address)


def unmap_address(address: int, nbytes: int) -> None:
    _libc.munmap(address, round_up(nbytes))


def lease_at(address: int, nbytes: int, on_release: Callable[[], None]) -> ctypes.Array:
    """A buffer over ``nbytes`` at an address mapped elsewhere; ``on_release`` runs when it is
    collected (the buffer is what every tensor and array viewing it keeps alive), in this
    process only (NOTE [ A forked child leaves its parent's things alone ]))."""
    lease = (ctypes.c_ubyte * nbytes).from_address(address)
    fin = finalize_here(lease, on_release)
    fin.atexit = False
    return lease


def map_lease(fd: int, nbytes: int) -> ctypes.Array:
    """Map ``nbytes`` of a segment into a buffer that unmaps itself when collected.

    Unlike ``mmap.mmap``, which keeps a duplicate fd per mapping, a lease holds no fd, so a
    user who keeps thousands of them does not run out of file descriptors.
    """
    nbytes = round_up(nbytes)
    address = map_address(fd, nbytes)
    return lease_at(address, nbytes, functools.partial(unmap_address, address, nbytes))


def close(fd: int) -> None:
    _open_fds.discard(fd)
    try:
        os.close(fd)
    except OSError:
        pass


def unlink(name: str | None) -> None:
    """Remove a named segment's name (no-op for memfd segments or names already gone)."""
    if name is None:
        return
    import _posixshmem  # pragma: no cover - non-Linux fallback

    try:  # pragma: no cover
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:  # pragma: no cover
        pass


def close_inherited() -> None:
    """Close the segment fds a forked child inherited (NOTE [ Inherited segment fds ])."""
    for fd in list(_open_fds):
        close(fd)


def dev_shm_free_bytes() -> int | None:
    """Free space of /dev/shm, where named segments (and torch's own) live; None if absent."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
