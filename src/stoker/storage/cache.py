"""``ShardCache``: whole objects kept on local disk within a byte budget, shared by every
process of a node that names the same directory.

NOTE [ Shard cache ]
Processes coordinate only through the directory, with ``flock`` locks (released by the kernel
when a process dies, so a killed worker never wedges the cache):

* ``<key>.lock`` (one per object): held exclusively while one process downloads the object, so
  each object is fetched once per node however many workers or threads want it;
* ``.dir.lock``: held while space is reserved or freed, so the budget is checked and spent
  atomically;
* the cached file itself: a reader holds a shared lock on it while it uses it ("pinned"), and
  eviction only removes a file it can lock exclusively without waiting, so a shard in use is
  never evicted.

Bytes on disk never exceed the budget: a download first reserves its full size (a
``<name>.<size>.partial`` file, counted at the size its name gives however much has been
written to it), evicting least recently used unpinned files, and is skipped (the caller
reads by range instead) when no room can be made. The bytes in use are kept in a ledger
(``.usage``, read and written under ``.dir.lock``), so a reservation with room to spare
costs no listing of the directory (listing and stating every cached file per download: a
fill of a 600 KB object took 1.44 ms of CPU with 200 files cached, 5.5 ms with 2,000; 0.69
and 1.6 then). It is written in place, not as a new file renamed over it: on this machine's
ext4 that took a fill of 600 KB from 2.0 ms of CPU to 1.3 (200 cached) and 1.7 (2,000).
The ledger never counts less than the disk holds: it is raised before a
reservation's file is made and lowered after a file is removed, so a process killed between
the two leaves it counting more. When it says the budget is full, or is missing, one pass
over the directory counts the truth (clearing what dead downloads left: NOTE [ Partial files
of dead downloads ]), evicts, and writes it again. The download streams into its reserved
file (a shard is never held in memory whole) and it appears under its final name only once
complete (``os.replace``).

NOTE [ A full disk under the cache ]
``cache_bytes`` is a promise the disk may not keep (other files fill it, or the budget was set
larger than it), nor the directory (a temporary-files cleaner removes it mid-run: its lock
files and directory are made again, and a download whose file went with it is read by range
this once). A download or reservation that finds the disk full (ENOSPC, EDQUOT) is not
an error of the read: its partial file is removed, the process's budget drops to the bytes
the cache holds then (warned once), and the object is read by range instead, as one that
does not fit. Later downloads evict least recently used files to make room within that
budget. Such an error is also never retried as a transient read error (``retry``).
Measured (20,000 samples in 200 shards of 1.27 MB, a 3 MB tmpfs under a cache of 16 GiB):
before, the epoch failed with ``[Errno 28] No space left on device``; now it completes with
every sample.

NOTE [ Reading a shard while it arrives ]
A download writes its object front to back into its ``.partial`` file (s3fs is asked to: it
would write the parts of an object over 50 MB at once, each at its offset), so the file's size
says how much has arrived. A reader that wants bytes of an object another thread or process is
downloading (the main process fetching for its workers, or another worker) reads them from
that file as soon as they are there (``read_arriving``), instead of waiting on the object's
lock for the whole of it: a 64 MB shard at 100 MB/s took 0.64 s to arrive whole, and under a
global shuffle a batch's samples wait only for their own bytes, so reading overlaps the
downloads. It looks again every 1-10 ms while the bytes have not arrived and the download
lives (its lock is held); once the file is renamed complete the same file descriptor reads it
all. A download that fails removes its file, and the reader falls back to the cached copy or
to fetching the object itself, as before. The bytes are checked by the reader as any cached
bytes are (each member's CRC-32 against the index).

NOTE [ Cached copies named by their content ]
A pack written again at the same URLs (``stoker pack`` to the same prefix) must not be read
from the old pack's cached shards. A reader that has a shard's index when it opens (a pack's
file of indexes, or the sidecars it reads at once) gives the cache a digest of it
(``ShardTable.digest``: the shard's size, every member's offset, size and CRC-32), and the
cached file is named by URL and digest: the new pack's shards are other files, downloaded
anew, whatever ``verify_crc`` says, and a pack unchanged keeps its copies. The old files are
never read again and go in least-recently-used order. A shard whose index is read only later
(remote packs of over 256 MiB of indexes, packs without a file of indexes over 256 shards)
or scanned from its bytes (a bare shard list) has no digest and is named by its URL alone: a
CRC check still catches an old copy there (NOTE [ A pack written again at the same place ] in
``formats/tar_index.py``).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import posixpath
import re
import time
import warnings
from collections.abc import Callable

from stoker.storage.cache_ledger import (
    DIR_LOCK,
    LOCK_DIR,
    PARTIAL,
    CacheLedger,
    causes,
    disk_full,
    unlink,
)
from stoker.storage.cache_locks import locked, open_held, release, unheld

# NOTE [ Reading a shard while it arrives ]: how often a reader looks again at a download in
# flight (first, then at most): the bytes come at the network's pace, ~1 MB in 10 ms here.
_ARRIVAL_POLL_S = (0.001, 0.01)


# Between an object's URL and a piece's number in the name a piece is cached under (NOTE
# [ Pieces of large objects ] in ``remote.py``): a NUL, which no object key holds.
PIECE_MARK = "\0piece:"


class ShardCache(CacheLedger):
    """Whole objects on local disk under ``directory``, at most ``budget_bytes`` of them (their
    bookkeeping: ``CacheLedger``)."""

    def __init__(self, directory: str, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(
                f"cache budget_bytes={budget_bytes}: must be > 0 (bytes of local disk the "
                "cache may use); pass cache_dir=None to read by range without a cache"
            )
        self.directory = os.path.abspath(directory)
        self.budget_bytes = int(budget_bytes)
        self._warned_full = False
        self._versions: dict[str, str] = {}  # NOTE [ Cached copies named by their content ]
        os.makedirs(os.path.join(self.directory, LOCK_DIR), exist_ok=True)

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, budget_bytes={self.budget_bytes})"

    def path_for(self, url: str) -> str:
        # A piece is tagged with its object's content (NOTE [ Pieces of large objects ]).
        version = self._versions.get(url.partition(PIECE_MARK)[0], "")
        return os.path.join(self.directory, _file_name(url, version))

    def expect_versions(self, versions: dict[str, str]) -> list[str]:
        """Tags of the objects' content (a digest of a shard's index): an object with a tag is
        cached under its URL and its tag, so a copy of other content cached under the same URL
        is never read for it (NOTE [ Cached copies named by their content ]). Returns the URLs
        whose tag changed."""
        changed = [url for url, tag in versions.items()
                   if self._versions.get(url, "") not in ("", tag)]
        self._versions.update(versions)
        return changed

    def open_pinned(self, url: str) -> int | None:
        """A read-only fd of the complete cached copy, pinned (shared lock) until closed; None
        when the object is not cached."""
        try:
            fd = os.open(self.path_for(url), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink == 0:  # evicted between our open and our lock
            os.close(fd)
            return None
        os.utime(fd)  # recently used: last in line for eviction
        return fd

    def fill(self, url: str, size_bytes: int | None, download: Callable[[], bytes],
             download_into: Callable[[str], int] | None = None) -> bool:
        """Make ``url`` cached, downloading it unless another process or thread has; False
        when it does not fit. ``download_into(file)`` writes the object into a local file and
        returns its length: used when the size is known beforehand, so the bytes go straight
        to disk. Otherwise ``download()`` returns them, and a size not known (None) is
        reserved once they are here."""
        if size_bytes is not None and size_bytes > self.budget_bytes:
            return False
        with locked(self._object_lock(url)):
            return self._fill_locked(url, size_bytes, download, download_into)

    def cached(self, url: str) -> bool:
        """Whether the complete object is in the cache now."""
        return os.path.exists(self.path_for(url))

    def read_arriving(self, url: str, size_bytes: int, offset: int, length: int) -> bytes | None:
        """``length`` bytes at ``offset`` of ``url`` from the file a download in flight
        (another thread's or process's) is writing, waiting while they have not arrived and
        the download lives (NOTE [ Reading a shard while it arrives ]). None when no download
        is in flight, or it ended without them: the caller pins the cached copy, or fetches
        the object itself."""
        final = self.path_for(url)
        partial = f"{final}.{size_bytes}{PARTIAL}"
        lock = self._object_lock(url)
        pause = _ARRIVAL_POLL_S[0]
        while True:
            try:
                fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = -1
            try:
                if fd >= 0:
                    st = os.fstat(fd)
                    if st.st_size >= offset + length:  # arrived (or complete: renamed)
                        return os.pread(fd, length, offset)
                    if st.st_nlink == 0:  # the download failed and removed it
                        return None
                elif os.path.exists(final):  # complete: the caller pins it
                    return None
                if unheld(lock):  # nobody downloads it
                    return None
            finally:
                if fd >= 0:
                    os.close(fd)
            time.sleep(pause)  # the bytes come in at the network's pace
            pause = min(pause * 2, _ARRIVAL_POLL_S[1])

    def discard(self, url: str, inode: int) -> None:
        """Remove the cached copy of ``url`` if it is still the file ``inode`` (one found
        stale: NOTE [ A pack written again at the same place ] in ``formats/tar_index.py``),
        pinned or not: a process reading it keeps its open copy. Counted as an eviction."""
        final = self.path_for(url)
        with locked(os.path.join(self.directory, DIR_LOCK)):
            try:
                st = os.stat(final)
            except FileNotFoundError:
                return
            if st.st_ino != inode or not unlink(final):
                return  # already replaced by a fresh copy
            self._add_to_ledger(-st.st_size)
            self._record_evictions(1)

    def claim(self, url: str) -> int | None:
        """Take the object's download lock now, without waiting, for a download another
        thread makes later (``fill_claimed``): whoever wants the object meanwhile waits for
        that download. None when the object is cached or its lock is held (downloading)."""
        final = self.path_for(url)
        if os.path.exists(final):
            return None
        fd = open_held(self._object_lock(url))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            release(fd)
            return None
        if os.path.exists(final):  # completed between the check and the lock
            release(fd)
            return None
        return fd

    def fill_claimed(self, url: str, claim: int, size_bytes: int,
                     download_into: Callable[[str], int]) -> bool:
        """``fill`` under the lock ``claim`` took, which is released here whatever happens."""
        try:
            if size_bytes > self.budget_bytes:
                return False
            return self._fill_locked(url, size_bytes, _no_download, download_into)
        finally:
            release(claim)

    def _object_lock(self, url: str) -> str:
        return os.path.join(self.directory, LOCK_DIR, os.path.basename(self.path_for(url)))

    def _fill_locked(self, url: str, size_bytes: int | None, download: Callable[[], bytes],
                     download_into: Callable[[str], int] | None) -> bool:
        final = self.path_for(url)
        if os.path.exists(final):
            return True
        data = None
        if size_bytes is None or download_into is None:
            data = download()
            if size_bytes is None:
                size_bytes = len(data)
        partial = f"{final}.{size_bytes}{PARTIAL}"
        try:
            if size_bytes > self.budget_bytes or not self._reserve(final, partial, size_bytes):
                return False
        except OSError as exc:
            if not disk_full(exc):
                raise
            self._shrink_to_disk(url)
            return False
        try:
            if data is None:
                assert download_into is not None
                written = download_into(partial)
            else:
                with open(partial, "r+b") as f:
                    written = f.write(data)
            if written != size_bytes:
                raise OSError(f"{url}: downloaded {written} bytes, the object is {size_bytes}")
            with locked(os.path.join(self.directory, DIR_LOCK)):
                os.replace(partial, final)  # under the lock: a count never sees both names
        except BaseException as exc:
            with locked(os.path.join(self.directory, DIR_LOCK)):
                if unlink(partial):
                    self._add_to_ledger(-size_bytes)
            if _raised_for(exc, partial):  # the cache's directory was removed under us
                os.makedirs(os.path.join(self.directory, LOCK_DIR), exist_ok=True)
                return False
            if not disk_full(exc):
                raise
            self._shrink_to_disk(url)
            return False
        return True

    def _shrink_to_disk(self, url: str) -> None:
        """NOTE [ A full disk under the cache ]: keep at most what the disk holds now."""
        used = self.used_bytes_locked()
        if used >= self.budget_bytes:
            return
        if not self._warned_full:
            self._warned_full = True
            warnings.warn(
                f"stoker: the disk under the shard cache {self.directory} is full (writing "
                f"{url}); this process now keeps at most {used} bytes there instead of "
                f"cache_bytes={self.budget_bytes}, evicting to make room, and reads what does "
                "not fit by range: free disk space or lower cache_bytes",
                RuntimeWarning, stacklevel=2)
        self.budget_bytes = used


@functools.lru_cache(maxsize=1 << 16)
def _file_name(url: str, version: str) -> str:
    """The cached file's name for ``url`` whose content is tagged ``version`` (or untagged:
    ""): asked for every shard of every batch the main process fetches for (a hash and a
    regex, ~5 us: 0.1 s of an epoch of 20,000 samples)."""
    named = f"{url}\0{version}" if version else url
    digest = hashlib.sha1(named.encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", posixpath.basename(url.rstrip("/")))[-80:]
    return f"{digest}-{name}"


def _raised_for(exc: BaseException, local: str) -> bool:
    """Whether ``exc``, or an error it was raised from, is the local file ``local`` (or its
    directory) missing; not an object missing from the store."""
    return any(isinstance(e, FileNotFoundError) and e.filename is not None
               and os.fspath(e.filename) in (local, os.path.basename(local))
               for e in causes(exc))


def _no_download() -> bytes:
    raise AssertionError("a claimed fill knows its size: it streams into its file")
