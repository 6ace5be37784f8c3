"""Batches pickled as torch's workers pickle them, with the fds carried by stoker's socket.

NOTE [ Batches cross as torch's do ]
By default (no ``slab_transport``) a batch leaves a worker exactly as torch's does: pickled
with ``ForkingPickler``, whose torch reductions move each storage into its own shared memory
(``share_memory_``, in place, as torch does) and rebuild it in the main process with torch's own
calls (``_new_shared_fd_cpu``, torch's ``shared_cache``, ``rebuild_tensor``): ``is_shared()``,
strides, storage offsets, whole storages of views, aliasing between leaves and across batches
are torch's, by construction. One thing differs, and no program can see it: torch's
``DupFd`` makes the main process connect to a listener thread in the worker to fetch each fd,
which waits for the worker's GIL (measured: ~11 ms a batch behind a worker collating in
Python). Here the storage reduction hands the fd to the pickler, and the worker sends the fds
with the batch over its socket (SCM_RIGHTS); ``loads`` rebuilds with the fds it was given.
Under the ``file_system`` sharing strategy torch's reduction runs unchanged (it sends names).
"""

from __future__ import annotations

import copyreg
import functools
import io
import os
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing import get_sharing_strategy
from torch.multiprocessing import reductions as torch_reductions

from stoker._core.notes import add_note
from stoker._core.torch_modes import unseen
from stoker.transport import reused_shm
from stoker.transport.reused_shm import MainSegments, WorkerSegments

_loading = threading.local()  # the fds of the payload being loaded on this thread


# NOTE [ No cycle through the pickler ]
# A pickler's memo holds every object it pickled, the batch's storages included, until the
# pickler goes. A pickler whose dispatch table held its own bound method was in a reference
# cycle, so it went only when the cyclic collector ran: each worker kept the shared memory of
# the batches it had sent mapped until then (measured: RssShmem of a worker swinging between
# 90 and 307 MiB, 64 batches of 4.8 MB, on an epoch of Pillow-decoded 224x224 crops; torch's
# workers hold none). The storage reduction is a partial over what the pickling gathers
# (``_Sent``), which holds no reference back: the pickler, its memo and the batch go as soon
# as ``dumps`` returns.


class _Sent:
    """What one pickling gathers: the storages' fds to send, and their bytes; the segments
    it may send by id (NOTE [ torch's shared memory, reused ])."""

    __slots__ = ("fds", "shared_bytes", "segments", "chosen")

    def __init__(self, fds: list[int], segments: WorkerSegments | None = None,
                 chosen: dict[int, Any] | None = None) -> None:
        self.fds = fds
        self.shared_bytes = 0  # the bytes of the storages it sends by fd or name
        self.segments = segments
        self.chosen = chosen


def _reduce_tensor(sent: _Sent, torch_reduce: Any, tensor: torch.Tensor) -> Any:
    # a leaf chosen to cross in its reused segment (NOTE [ One reduction per reused leaf ]
    # in ``transport.reused_shm``); every other tensor: torch's reduction
    if (sent.chosen and sent.segments is not None and tensor.is_cpu
            and tensor.layout is torch.strided and not tensor.is_nested):
        try:
            ptr = tensor.untyped_storage().data_ptr()
        except Exception:  # no storage of its own to look up (never chosen): torch's way
            return torch_reduce(tensor)
        seg = sent.chosen.pop(ptr, None)
        if seg is not None:
            sent.shared_bytes += seg.nbytes
            return sent.segments.reduce(seg, tensor, sent.fds)
    return torch_reduce(tensor)


def _reduce_storage(sent: _Sent, storage: torch.UntypedStorage) -> Any:
    # torch's reduce_storage, but for its fd branch: the fd travels with the batch
    sent.shared_bytes += storage.nbytes()
    if sent.segments is not None:  # a segment going torch's way is the main process's now
        sent.segments.gone(storage.data_ptr())
    if (storage.is_cuda or storage.device.type == "meta"
            or get_sharing_strategy() == "file_system" or storage.size() == 0):
        return torch_reductions.reduce_storage(storage)
    fd, size = storage._share_fd_cpu_()
    cache_key = torch_reductions.fd_id(fd)
    sent.fds.append(os.dup(fd))  # the storage (and its fd) may be gone before sending
    torch_reductions.shared_cache[cache_key] = torch_reductions.StorageWeakRef(storage)
    return (_rebuild_storage_fd, (type(storage), len(sent.fds) - 1, size))


class _Pickler(ForkingPickler):
    """``ForkingPickler`` (torch's reductions) whose storages give their fds to ``sent``
    (NOTE [ No cycle through the pickler ])."""

    def __init__(self, file: io.BytesIO, sent: _Sent) -> None:
        super().__init__(file)
        table = self.dispatch_table  # ForkingPickler's __init__ made it: this pickler's own
        shared = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
        if table is copyreg.dispatch_table or table is shared:
            table = self.dispatch_table = dict(table)  # a ForkingPickler that shares one
        table[torch.UntypedStorage] = functools.partial(_reduce_storage, sent)
        if sent.chosen and torch.Tensor in table:
            table[torch.Tensor] = functools.partial(_reduce_tensor, sent, table[torch.Tensor])


def dumps(obj: Any, segments: WorkerSegments | None = None,
          chosen: dict[int, Any] | None = None) -> tuple[bytes, list[int], int]:
    """``obj`` pickled as torch's workers pickle it, the fds to send with it (the caller
    sends, then closes them), and its size: the shared storages' bytes plus the payload's
    (arrays and other data pickled by value), counted while pickling. The storages in
    ``chosen`` (``segments.prepare``) go by their segment's id."""
    buf = io.BytesIO()
    sent = _Sent([], segments, chosen)
    try:
        with unseen():  # torch's feeder thread pickles where the program's modes are not
            _Pickler(buf, sent).dump(obj)
    except BaseException:
        close(sent.fds)
        raise
    payload = buf.getvalue()
    return payload, sent.fds, sent.shared_bytes + len(payload)


def loads(payload: bytes, fds: list[int], segments: MainSegments | None = None) -> Any:
    """What ``dumps`` pickled, rebuilt with ``fds`` (received in order) and the sending
    worker's ``segments``; closes the fds."""
    _loading.fds = fds
    reused_shm.loading_into(segments, fds)
    try:
        return ForkingPickler.loads(payload)
    finally:
        _loading.fds = None
        reused_shm.loading_into(None, None)
        close(fds)


class Unpickled:
    """A batch that came without a slab, unpickled when it arrived, as torch's loop does (or
    the error that unpickling it raised, raised when the batch is due)."""

    __slots__ = ("batch", "error", "seconds")

    def __init__(self, batch: Any, error: Exception | None = None, seconds: float = 0.0) -> None:
        self.batch = batch
        self.error = error
        self.seconds = seconds  # spent unpickling (for ``stats()``)


def received(payload: bytes, fds: list[int], segments: MainSegments | None = None
             ) -> Unpickled:
    """``loads`` at arrival; an error is kept for when the batch is due."""
    t0 = time.perf_counter()
    try:
        return Unpickled(loads(payload, fds, segments), seconds=time.perf_counter() - t0)
    except Exception as exc:
        return Unpickled(None, out_of_fds(exc))


# NOTE [ Out of file descriptors ]
# Each shared storage of a batch keeps a file descriptor open in the main process for as long
# as the batch is held (torch's reductions, by construction), so a loop that keeps its batches
# reaches `ulimit -n`. torch then raises a RuntimeError saying to raise the limit or change the
# sharing strategy. Here the fds come with the message, and what fails is their receipt (the
# kernel drops fds it has no slot for: OSError EMFILE, in ``workers/protocol.py``) or torch's
# own rebuild (``_new_shared_fd_cpu`` dup()s the fd it is given: "could not duplicate a shared
# memory file descriptor", which names no remedy). Either is raised as torch's error (its
# type, its text; the original as the cause) when the batch is due, with a note naming the
# limit and stoker's own remedy, the slabs (``slab_transport``: a slab is mapped without an
# fd, however many batches are held).
_TORCH_OUT_OF_FDS = (
    "Too many open files. Communication with the workers is no longer possible. Please "
    "increase the limit using `ulimit -n` in the shell or change the sharing strategy by "
    "calling `torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of "
    "your code"
)


def out_of_fds(exc: Exception) -> Exception:
    """torch's error for a process out of file descriptors (NOTE [ Out of file descriptors ])
    in place of the rebuild's, ``exc`` itself otherwise."""
    if isinstance(exc, RuntimeError) and (
            "could not duplicate a shared memory file descriptor" in str(exc)):
        return too_many_open_files(exc)
    return exc


def too_many_open_files(cause: BaseException) -> RuntimeError:
    """torch's error for a batch the main process had no file descriptor left for, caused by
    ``cause``, with stoker's note (NOTE [ Out of file descriptors ])."""
    err = RuntimeError(_TORCH_OUT_OF_FDS)
    err.__cause__ = cause
    import resource  # only on this failure path: torch's loader does not import it

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    most = "" if limit == resource.RLIM_INFINITY else f" {limit}"
    add_note(err,
        "stoker: each tensor of a batch from the workers keeps a file descriptor open while "
        f"the batch is held (as under torch), and this process may have{most or ' no more'} "
        "open (`ulimit -n`). Hold fewer batches (keep copies: `t.clone()`, or `t.tolist()`), or "
        "pass beyond_torch={'slab_transport'} to stoker.DataLoader: batches then arrive in "
        "reused shared-memory slabs, with no file descriptor per batch.")
    return err


def close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _rebuild_storage_fd(cls: Any, index: int, size: int) -> Any:
    # torch's rebuild_storage_fd, with the fd given instead of fetched (it closes it: ``loads``)
    fd = _loading.fds[index]
    key = torch_reductions.fd_id(fd)
    storage = torch_reductions.storage_from_cache(cls, key)
    if storage is not None:
        return storage
    storage = cls._new_shared_fd_cpu(fd, size)
    torch_reductions.shared_cache[key] = torch_reductions.StorageWeakRef(storage)
    return storage
