"""The shard cache's ``flock`` locks: opened, held and released so that none outlives the
process or the download that took it (``storage/cache.py`` says which lock guards what).

NOTE [ Cache locks across fork ]
A ``flock`` belongs to the open file, and a forked child inherits every open file of its
parent: forked while a parent's thread downloads (say, a shard fetched ahead after
``dataset[0]``, then ``DataLoader(num_workers=2)``), a worker holds a copy of that download's
lock which nothing in it will ever close, so the lock outlives the download and the worker
that wants the object waits on it forever. A process's exclusive lock files are therefore
recorded while open (``_HELD``) and a forked child closes its copies at once: the lock is then
the parent's alone and goes with the parent's close. Forking waits for no lock file to be
opened or closed meanwhile (``_HELD_GUARD``), so the record matches the open files.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_HELD: set[int] = set()  # this process's lock files, open
_HELD_GUARD = threading.Lock()


def _close_inherited_locks() -> None:
    global _HELD_GUARD
    _HELD_GUARD = threading.Lock()  # the parent's was held across the fork
    for fd in _HELD:
        os.close(fd)  # the parent's copy keeps the lock until its own download ends
    _HELD.clear()


os.register_at_fork(before=lambda: _HELD_GUARD.acquire(),
                    after_in_parent=lambda: _HELD_GUARD.release(),
                    after_in_child=_close_inherited_locks)


def open_held(path: str) -> int:
    """A lock file opened and recorded; its directory is made again if it was removed (NOTE
    [ A full disk under the cache ] in ``storage/cache.py``)."""
    with _HELD_GUARD:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        _HELD.add(fd)
    return fd


def release(fd: int) -> None:
    """Close a lock file ``open_held`` opened, and with it its lock."""
    with _HELD_GUARD:
        _HELD.discard(fd)
        os.close(fd)


def release_claim(fd: int) -> None:
    """Give up a ``ShardCache.claim`` without downloading."""
    release(fd)


@contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold the exclusive lock of the lock file ``path`` (made if missing)."""
    fd = open_held(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        release(fd)


def unheld(path: str) -> bool:
    """Whether no process holds the lock file ``path`` now (a missing one: nobody does).
    Not created; tested by taking the lock without waiting, and letting it go at once."""
    with _HELD_GUARD:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        _HELD.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        release(fd)
    return True


def evict(path: str) -> bool:
    """Remove a cached file nobody has pinned (a reader holds a shared lock on it); False if
    it is in use (or already gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        os.unlink(path)
    finally:
        os.close(fd)
    return True
