"""``CacheLedger``: the bytes a shard cache's directory holds, kept within its budget. A
reservation counts a download's full size before it starts, the ledger (``.usage``) keeps the
sum, a recount lists the directory when the ledger is missing or full, and eviction frees the
least recently used unpinned files (NOTE [ Shard cache ] in ``cache.py``).

NOTE [ Partial files of dead downloads ]
A download killed (kill -9, OOM) leaves its ``.partial`` file, counted at its reserved size.
Cleared only by a later download of the same object, the partial of an object nobody asks for
again (another pack or URL on the same directory) kept its bytes of the budget forever: a
stale 60 KB reservation left a 100 KB cache room for one 30 KB shard at a time. A live
download holds its object's lock (``.locks/<final name>``) from before its partial is made
until after it is renamed or removed, both under ``.dir.lock``; so a recount, under
``.dir.lock``, removes each partial whose object's lock it can take without waiting (or
whose lock file is gone: nobody holds it either), and keeps one whose lock is held. Taking
the lock to test it makes a ``fill`` of that object wait for the test only, and a ``claim``
skip the object (its reader downloads it instead).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import NamedTuple

from stoker.storage.cache_locks import evict, locked, unheld

LOCK_DIR = ".locks"
DIR_LOCK = ".dir.lock"
_LEDGER = ".usage"
_EVICTIONS = ".evictions"  # one byte per file evicted, ever: see ``evictions``
PARTIAL = ".partial"


class CacheLedger:
    """``ShardCache``'s bookkeeping of its ``budget_bytes`` under ``directory``."""

    directory: str
    budget_bytes: int

    def evictions(self) -> int:
        """How many files any process has evicted from this directory: a process that
        remembers which objects were cached can trust that while this number stays the same
        (one ``stat`` instead of one per object)."""
        try:
            return os.stat(os.path.join(self.directory, _EVICTIONS)).st_size
        except FileNotFoundError:
            return 0

    def used_bytes(self) -> int:
        """Bytes the cache's files take (reservations of downloads in flight included)."""
        return sum(e.size for e in self._entries())

    def used_bytes_locked(self) -> int:
        """``used_bytes`` counted while no process reserves, evicts or renames."""
        with locked(os.path.join(self.directory, DIR_LOCK)):
            return self.used_bytes()

    def _reserve(self, final: str, partial: str, size_bytes: int) -> bool:
        with locked(os.path.join(self.directory, DIR_LOCK)):
            used = self._read_ledger()
            if used is None or used + size_bytes > self.budget_bytes:
                used = self._recount_and_evict(final, size_bytes)
                if used + size_bytes > self.budget_bytes:
                    self._write_ledger(used)
                    return False
            self._write_ledger(used + size_bytes)  # first: a death now leaves it counting more
            with open(partial, "wb"):  # its name holds the reservation
                pass
        return True

    def _recount_and_evict(self, final: str, size_bytes: int) -> int:
        """The bytes in use, counted from the directory (under ``.dir.lock``) after clearing
        what dead downloads left (of this object: we hold its lock, so nobody else's; of
        others: NOTE [ Partial files of dead downloads ]) and evicting least recently used
        unpinned files until ``size_bytes`` fit, if they can. Cached files are sorted only
        when room is needed."""
        dead_prefix = os.path.basename(final) + "."
        used, cached = 0, []
        for entry in self._entries():
            if not entry.partial:
                cached.append(entry)
            elif os.path.basename(entry.path).startswith(dead_prefix) or self._abandoned(
                    entry.path):
                unlink(entry.path)
                continue
            used += entry.size
        evicted = 0
        if used + size_bytes > self.budget_bytes:
            for entry in sorted(cached, key=lambda e: e.mtime):
                if evict(entry.path):
                    used -= entry.size
                    evicted += 1
                    if used + size_bytes <= self.budget_bytes:
                        break
        if evicted:
            self._record_evictions(evicted)
        return used

    def _abandoned(self, partial: str) -> bool:
        """Whether no process holds the download lock of ``partial``'s object: its download
        died (NOTE [ Partial files of dead downloads ]). Asked under ``.dir.lock``."""
        name = os.path.basename(partial)[: -len(PARTIAL)].rsplit(".", 1)[0]
        return unheld(os.path.join(self.directory, LOCK_DIR, name))

    def _record_evictions(self, count: int) -> None:
        try:
            with open(os.path.join(self.directory, _EVICTIONS), "ab") as f:
                f.write(b"e" * count)
        except OSError as exc:  # a full disk: a process trusting its memory of what is
            if not disk_full(exc):  # cached finds a shard gone and downloads it itself
                raise

    def _read_ledger(self) -> int | None:
        try:
            fd = os.open(os.path.join(self.directory, _LEDGER), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # none yet: count instead
            return None
        try:
            return int(os.read(fd, 64))
        except ValueError:  # cut short, or not ours: count instead
            return None
        finally:
            os.close(fd)

    def _write_ledger(self, used: int) -> None:
        # In place, one fixed-width write: every reader holds .dir.lock, so none sees it half
        # written, and a killed process completes a write or makes none. Not a new file and a
        # rename each time: creating a file took ~0.45 ms of CPU on an ext4 disk here, a
        # third of a shard's whole cache bookkeeping.
        path = os.path.join(self.directory, _LEDGER)
        data = b"%020d\n" % max(0, used)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))  # a longer ledger left by another version
            finally:
                os.close(fd)
        except OSError as exc:
            if not disk_full(exc):
                raise
            unlink(path)  # the next reservation counts the directory instead

    def _add_to_ledger(self, delta: int) -> None:
        used = self._read_ledger()
        if used is not None:
            self._write_ledger(used + delta)

    def _entries(self) -> list[_Entry]:
        out = []
        with os.scandir(self.directory) as it:
            for entry in it:
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                partial = entry.name.endswith(PARTIAL)  # counted at its reserved size
                size = max(st.st_size, _reserved_size(entry.name)) if partial else st.st_size
                out.append(_Entry(entry.path, size, st.st_mtime, partial))
        return out


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, says the local disk is full."""
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
               for e in causes(exc))


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    for _ in range(8):  # a read error wraps the cause in one or two more
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


class _Entry(NamedTuple):
    path: str
    size: int
    mtime: float
    partial: bool


def _reserved_size(partial_name: str) -> int:
    """The size a ``<name>.<size>.partial`` file reserves (0 for one without it)."""
    digits = partial_name[: -len(PARTIAL)].rsplit(".", 1)[-1]
    return int(digits) if digits.isdigit() else 0


def unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
