"""torch's shared memory for a batch, created once and written again by later batches.

NOTE [ torch's shared memory, reused ]
Sent torch's way (NOTE [ Batches cross as torch's do ]), every tensor of every batch gets a
new shared-memory segment: the worker creates it (open, truncate, allocate, map: about 100 us
on this project's VM) and faults its pages in, the main process maps it again and faults them
in, and both unmap it later. For small batches that is most of a batch's cost (measured: a
256x64 float32 batch and its 256 labels, 0.55 ms of a worker's 0.95 ms). Here a worker keeps
the segments it made and writes later batches into them once the main process says the user
let go, so neither side creates, maps or faults anything in the steady state.

What the main process hands out is what torch's rebuild makes, by construction: a storage
made by torch's own ``_new_shared_fd_cpu`` from the segment's fd (``is_shared()``, not
resizable, its own fd), of exactly the tensor's bytes, wrapped by torch's own
``rebuild_tensor`` (the pickle is torch's; only the storage's reduction differs). A segment
is reused only where nothing could tell the difference:

* only tensors a worker made fresh for this batch and holds nowhere else: the outputs of
  ``_new_shared`` while the worker runs one task (``default_collate`` and the gathers of
  torch's classes allocate there), and plain-memory leaves of the batch that nothing else
  references (``default_collate``'s labels). Both are checked, leaf by leaf, when the batch
  is packed: the leaf's tensor object is held only by its container (exact ``dict``,
  ``list``, ``tuple``), its storage by that tensor alone, contiguous from offset 0 over the
  whole storage. Anything else (a view, a tensor the dataset keeps, one leaf twice in a
  batch) crosses torch's way, with torch's aliasing;
* in the main process, a segment goes back to its worker only when nothing holds it: no
  tensor (the storage's use count), no storage object (its reference count) but the
  table's, no weak reference to that object (which would still reach it). A batch the user
  keeps keeps its segments; after ``_MAX_BUSY`` checks the table forgets them (the worker
  too) and they live on as torch's would;
* a segment that may be seen from another process is never written again: one sent on by
  torch's reductions (its key in torch's ``shared_cache``), any segment lent out when this
  process forked (a child maps it too), one whose storage was moved (its data pointer
  changed). In a worker, a fork during a task keeps every segment that task handed out.

Only with torch's ``file_descriptor`` strategy, in a worker that runs one task at a time
(no fetch threads), without ``slab_transport``, and with the fast paths on (``fast_paths=False``
sends every batch in new shared memory, as torch does). A worker's free segments are its memory
while it serves an epoch, as torch's allocator keeps freed memory: at most
``_MAX_FREE_PER_SIZE`` of a size. When an epoch ends, persistent workers and the main process
forget every segment nothing holds, so between epochs only the batches the user keeps hold
memory, as under torch (non-persistent workers exit).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any
from weakref import getweakrefcount

import torch
from torch.multiprocessing import get_sharing_strategy
from torch.multiprocessing import reductions as torch_reductions

from stoker._core.torch_modes import modes_active, unseen
from stoker._core.torch_own import c_function, c_method

_MAX_BUSY = 16  # checks a lent segment may stay held before the table forgets it
_MAX_FREE_PER_SIZE = 8

_forks = 0  # forks of this process so far (a child maps every shared segment too)


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(before=_count_fork)

_use_count = torch._C._storage_Use_Count
_UntypedStorage = torch.UntypedStorage
_base_new_shared = torch.storage._StorageBase.__dict__["_new_shared"].__func__


def _refs(obj: Any) -> int:
    """``obj``'s references besides this call's own."""
    return sys.getrefcount(obj) - 2


# (use count, references) of a storage that nothing but stoker holds, as each check reads
# it (the caller's names count); ``_self_check`` proves them on this torch at import.
_SEGMENT_LEAF = (2, 3)  # a pool segment under one batch leaf: the leaf, the pool, a local
_PLAIN_LEAF = (2, 2)  # a leaf's own plain storage: the leaf, a local
_MAIN_FREE = (1, 2)  # a main-process table entry: the entry, a local
_POOL_FREE = (1, 2)  # a worker's segment: the pool, a local
_TOP_LEAF = 2  # references to a batch that is one tensor: the packer's name, prepare's
_CONTAINED_LEAF = 2  # references to a leaf tensor: its container, the walk's loop name


def _held_only_by_pool(seg: _Segment) -> bool:
    storage = seg.storage
    return ((_use_count(storage._cdata), _refs(storage)) == _POOL_FREE
            and not getweakrefcount(storage))


def eligible() -> bool:
    """Whether batches may reuse segments in this process now: torch's default strategy,
    nobody else has replaced torch's ``_new_shared``, and this torch counts references as
    the checks read them (``_self_check``)."""
    return (get_sharing_strategy() == "file_descriptor"
            and "_new_shared" not in vars(_UntypedStorage) and _self_check())


# stoker's own calls (the self-check, a leaf moved into a reused segment): torch's C functions
# and methods themselves, which a program's rebinding does not reach (NOTE [ torch's own
# functions ]); the rebuild in the main process makes torch's rebuild's calls, as torch's does
_zeros, _tensor, _empty = c_function("zeros"), c_function("tensor"), c_function("empty")
_set, _copy, _new, _resize = (c_method("set_"), c_method("copy_"), c_method("new"),
                              c_method("resize_"))


@functools.cache
def _self_check() -> bool:
    """The checks on small batches, run once: what is held elsewhere is never chosen nor
    given back, what nothing holds is. False (no reuse) if this torch counts otherwise."""
    try:
        with unseen():  # NOTE [ The program's torch modes see torch's calls ]
            return _check_worker_side() and _check_main_side()
    except Exception:  # an API this torch lacks: torch's way, as before
        return False


def _collated(n: int) -> torch.Tensor:
    # as torch's collate_tensor_fn allocates an output in a worker
    elem = _zeros(n)
    storage = elem._typed_storage()._new_shared(n, device=elem.device)
    return _resize(_new(elem, storage), n)


def _check_worker_side() -> bool:
    pool = WorkerSegments()
    pool._begin()
    try:
        batch: Any = {"x": _collated(4), "y": _tensor([1, 2])}
        all_free = set(pool.prepare(batch))
        if all_free != {batch["x"].data_ptr(), batch["y"].data_ptr()}:
            return False
        held_x: Any = {"x": _collated(4), "y": [_collated(4)]}
        keep = held_x["x"]
        view = held_x["y"][0][1:]
        stored = {"x": _collated(4)}
        keep_storage = stored["x"].untyped_storage()
        twice = _tensor([3, 4])
        aliased = [twice, twice]
        del twice
        for batch in (held_x, stored, aliased):
            if pool.prepare(batch):
                return False
        batch = _collated(4)
        if len(pool.prepare(batch)) != 1:
            return False
        also = batch
        batch = _collated(4)
        if pool.prepare(also) or len(pool.prepare(batch)) != 1:
            return False
        del also
        del keep, view, keep_storage, batch, held_x, stored, aliased, all_free
        spare = _collated(4)
        kept = _collated(4)
        del spare
    finally:
        pool.end_task()
    free = pool._free.get(16, [])
    return len(free) >= 1 and kept.untyped_storage().data_ptr() not in pool._by_ptr


def _check_main_side() -> bool:
    table = MainSegments()
    source = _base_new_shared(_UntypedStorage, 16)
    fd, _ = source._share_fd_cpu_()
    storage = table.rebuild(0, 16, fd)
    t = _set(_empty(0), storage, 0, (4,), (1,))
    del storage
    if table.settle() != []:
        return False
    held = t.untyped_storage()
    del t
    if table.settle() != []:
        return False
    del held
    return table.settle() == [0]


class _Segment:
    __slots__ = ("id", "storage", "nbytes", "announced")

    def __init__(self, seg_id: int, storage: torch.UntypedStorage) -> None:
        self.id = seg_id
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.announced = False  # its fd went to the main process


class WorkerSegments:
    """A worker's segments: handed to ``_new_shared`` during a task (``task()``), matched to
    a batch's leaves (``prepare``), sent by id (``reduce``), given back by the main process
    (``release``)."""

    def __init__(self) -> None:
        self._free: dict[int, list[_Segment]] = {}
        self._by_ptr: dict[int, _Segment] = {}  # every segment this worker keeps
        self._candidates: list[_Segment] = []  # handed out during this task
        self._out: dict[int, _Segment] = {}  # sent by id, not yet given back: id -> segment
        self._next_id = 0
        self._forks_at_start = 0
        self.active = False
        self.dropped: list[int] = []  # ids to tell the main process to forget (``Done.retired``)

    # -- during a task --------------------------------------------------------------------

    def start_task(self) -> bool:
        """Hand ``_new_shared``'s CPU storages out of this pool until ``end_task``; False
        (and nothing changed) where reuse is not allowed now."""
        if not eligible() or modes_active():  # a mode sees torch's _new_shared alone
            return False
        self._begin()
        return True

    def _begin(self) -> None:
        pool = self

        def _new_shared(cls: Any, size: int, *, device: Any = "cpu") -> Any:
            if cls is _UntypedStorage and torch.device(device).type == "cpu" and pool.active:
                return pool._take(int(size), candidate=True).storage
            return _base_new_shared(cls, size, device=device)

        _UntypedStorage._new_shared = classmethod(_new_shared)  # type: ignore[method-assign,assignment]
        self.active = True
        self._forks_at_start = _forks

    def end_task(self) -> None:
        """Stop handing out; segments handed out this task that nothing holds are free again,
        the rest are forgotten (whoever holds them keeps them, as torch's)."""
        if not self.active:
            return
        self.active = False
        try:
            del _UntypedStorage._new_shared
        except AttributeError:
            pass
        forked = _forks != self._forks_at_start
        candidates, self._candidates = self._candidates, []
        for seg in candidates:  # those not sent with the batch
            if not forked and _held_only_by_pool(seg):
                self._put_free(seg)
            else:
                self._forget(seg)

    def _take(self, nbytes: int, candidate: bool) -> _Segment:
        free = self._free.get(nbytes)
        if free:
            seg = free.pop()
        else:
            storage = _base_new_shared(_UntypedStorage, nbytes)
            seg = _Segment(self._next_id, storage)
            self._next_id += 1
            self._by_ptr[storage.data_ptr()] = seg
        if candidate:
            self._candidates.append(seg)
        return seg

    def _put_free(self, seg: _Segment) -> None:
        free = self._free.setdefault(seg.nbytes, [])
        if len(free) < _MAX_FREE_PER_SIZE:
            free.append(seg)
        else:
            self._drop_free(seg)

    def _forget(self, seg: _Segment) -> None:
        self._by_ptr.pop(seg.storage.data_ptr(), None)

    def _drop_free(self, seg: _Segment) -> None:
        # one the main process has mapped too and has given back: it forgets it as well
        self._forget(seg)
        if seg.announced:
            self.dropped.append(seg.id)

    def prepare(self, batch: Any) -> dict[int, _Segment]:
        """The batch's leaves that may cross as reused segments, by data pointer; a
        plain-memory leaf that qualifies is moved into a segment first (as torch's reduction
        moves it into new shared memory)."""
        chosen: dict[int, _Segment] = {}
        if not self.active:
            return chosen
        if type(batch) is torch.Tensor:
            if _refs(batch) == _TOP_LEAF:  # the caller's name and this call's
                self._leaf(batch, chosen)
        else:
            self._walk(batch, chosen)
        return chosen

    def _walk(self, node: Any, chosen: dict[int, _Segment]) -> None:
        kind = type(node)
        if kind is dict:
            values = node.values()
        elif kind is list or kind is tuple:
            values = node
        else:
            return
        for value in values:
            if type(value) is torch.Tensor:
                if _refs(value) == _CONTAINED_LEAF:  # nothing else holds it
                    self._leaf(value, chosen)
            else:
                self._walk(value, chosen)

    def _leaf(self, t: torch.Tensor, chosen: dict[int, _Segment]) -> None:
        if (t.is_nested or t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad
                or t.is_quantized or t.storage_offset() != 0 or not t.is_contiguous()):
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0 or nbytes != t.numel() * t.element_size():
            return
        ptr = storage.data_ptr()
        seg = self._by_ptr.get(ptr)
        uses, refs = _use_count(storage._cdata), _refs(storage)
        if getweakrefcount(storage):
            return  # someone may reach it again
        if seg is not None:  # made by _new_shared this task, held by this leaf alone
            if (seg in self._candidates and ptr not in chosen
                    and (uses, refs) == _SEGMENT_LEAF):
                self._candidates.remove(seg)
                chosen[ptr] = seg
            return
        if storage.is_shared() or (uses, refs) != _PLAIN_LEAF:
            return  # shared memory that is not ours, or held elsewhere: torch's way
        del storage
        seg = self._take(nbytes, candidate=False)
        out = _set(_empty(0, dtype=t.dtype), seg.storage, 0, t.shape, t.stride())
        _copy(out, t)
        _set(t, seg.storage, 0, t.shape, t.stride())
        chosen[seg.storage.data_ptr()] = seg

    def gone(self, ptr: int) -> None:
        """The storage at ``ptr`` was sent torch's way: if it is a segment, never write it
        again (the main process maps it as torch's, for as long as it likes)."""
        seg = self._by_ptr.pop(ptr, None)
        if seg is not None and seg in self._candidates:
            self._candidates.remove(seg)

    def unsent(self, chosen: dict[int, _Segment]) -> None:
        """Segments ``prepare`` chose that did not go (the pickling failed): forgotten, as the
        batch that holds them may be anywhere now."""
        for seg in chosen.values():
            self._forget(seg)
        chosen.clear()

    def reduce(self, seg: _Segment, leaf: torch.Tensor, fds: list[int]) -> tuple[Any, tuple]:
        """The pickle reduction of ``leaf``, the tensor ``prepare`` chose over ``seg``: the
        segment's id (and its fd the first time) with the tensor's dtype, shape and strides
        (NOTE [ One reduction per reused leaf ])."""
        index = -1
        if not seg.announced:
            fd, _ = seg.storage._share_fd_cpu_()
            fds.append(os.dup(fd))
            index = len(fds) - 1
            seg.announced = True
        self._out[seg.id] = seg
        return (_rebuild_reused, (seg.id, seg.nbytes, index, leaf.dtype, tuple(leaf.shape),
                                  leaf.stride()))

    def drop_free(self) -> None:
        """Forget every free segment (an epoch ended; the main process forgot them too)."""
        for free in self._free.values():
            for seg in free:
                self._forget(seg)
        self._free.clear()

    # -- the main process's answers -------------------------------------------------------

    def release(self, ids: list[int]) -> None:
        """Ids the main process let go of: ``id`` may be written again, ``~id`` is forgotten."""
        for i in ids:
            seg = self._out.pop(i if i >= 0 else ~i, None)
            if seg is None:
                continue
            if i >= 0:
                self._put_free(seg)
            else:
                self._forget(seg)


class _Lent:
    __slots__ = ("storage", "key", "ptr", "forks", "busy")

    def __init__(self, storage: torch.UntypedStorage, key: Any) -> None:
        self.storage = storage
        self.key = key
        self.ptr = storage.data_ptr()
        self.forks = _forks
        self.busy = 0


class MainSegments:
    """One worker's segments in the main process: rebuilt from their fd once, handed out
    again by id, and given back (``settle``) once nothing holds them."""

    def __init__(self) -> None:
        self._table: dict[int, _Lent] = {}
        self._lent: list[int] = []
        self._lock = threading.Lock()

    def rebuild(self, seg_id: int, nbytes: int, fd: int | None) -> torch.UntypedStorage:
        with self._lock:
            if fd is not None:
                storage = _UntypedStorage._new_shared_fd_cpu(  # type: ignore[attr-defined]
                    fd, nbytes)
                entry = _Lent(storage, torch_reductions.fd_id(fd))
                self._table[seg_id] = entry
            else:
                entry = self._table[seg_id]
                entry.forks, entry.busy = _forks, 0
            self._lent.append(seg_id)
            return entry.storage

    def settle(self) -> list[int]:
        """Ids to send back to the worker: ``id`` for a segment nothing holds, ``~id`` for
        one to forget (held too long, or maybe seen from another process)."""
        out: list[int] = []
        with self._lock:
            if not self._lent:
                return out
            still = []
            cache = torch_reductions.shared_cache
            for seg_id in self._lent:
                entry = self._table[seg_id]
                storage = entry.storage
                # A tensor still holds it (the usual case: a batch not yet handed out, or the
                # user's): busy, whatever else holds; the checks below wait until it is not.
                held = _use_count(storage._cdata) != _MAIN_FREE[0]
                if not held and (entry.forks != _forks or entry.key in cache
                                 or storage.data_ptr() != entry.ptr):
                    del self._table[seg_id]
                    out.append(~seg_id)
                elif not held and _refs(storage) == _MAIN_FREE[1] and not getweakrefcount(
                        storage):
                    out.append(seg_id)  # only the table's entry holds it (no weak reference)
                elif entry.busy >= _MAX_BUSY:
                    del self._table[seg_id]
                    out.append(~seg_id)
                else:
                    entry.busy += 1
                    still.append(seg_id)
                del storage
            self._lent = still
        return out

    def end_epoch(self) -> list[int]:
        """What to send the worker as an epoch ends (``Release.epoch_ended``): the ids nothing
        holds now; every segment not lent is forgotten here, and the worker forgets its free
        ones, so between epochs only the batches the user holds keep memory, as under torch."""
        out = self.settle()
        with self._lock:
            lent = set(self._lent)
            for seg_id in [i for i in self._table if i not in lent]:
                del self._table[seg_id]
        return out

    def drop(self, ids: list[int]) -> None:
        """Segments the worker forgot (it keeps only so many free ones of a size)."""
        with self._lock:
            for seg_id in ids:
                self._table.pop(seg_id, None)


_loading = threading.local()  # the MainSegments of the batch being unpickled on this thread


def loading_into(table: MainSegments | None, fds: list[int] | None) -> None:
    """The worker's table and the fds received with the payload about to be unpickled on
    this thread (None, None once done)."""
    _loading.table, _loading.fds = table, fds


# NOTE [ One reduction per reused leaf ]
# torch's reduction of a tensor pickles a typed storage whose reduction pickles the untyped
# one, and its rebuild undoes the three (``rebuild_tensor``, ``rebuild_typed_storage``, the
# storage's), about 10 us per tensor on each side. A leaf ``prepare`` chose is a plain CPU
# tensor at offset 0 that needs no grad (so has no hooks) and is held by nothing else, so the
# checks torch's reduction makes pass for it, and its rebuild comes down to the calls on
# tensors that torch's makes: ``_rebuild_reused`` makes them (an empty tensor of the dtype on
# the storage's device, ``set_`` over the storage at offset 0, ``requires_grad = False``),
# giving the tensor torch's rebuild gives. Every other tensor goes through torch's reduction.


def rebuilt_as_torch(storage: torch.UntypedStorage, dtype: torch.dtype, offset: Any,
                     size: Any, stride: Any) -> torch.Tensor:
    """The tensor torch's rebuild of a shared tensor makes over ``storage``, by the calls on
    tensors it makes (a mode sees the same calls; the version counter is its ``set_``'s)."""
    if "hmac" not in sys.modules:
        # torch's main process receives a worker's storage through multiprocessing's
        # resource_sharer, whose handshake loads hmac: a program finds it loaded, as under torch
        import hmac  # noqa: F401
    t = torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    t.requires_grad = False  # as torch's rebuild sets it
    return t


def _rebuild_reused(seg_id: int, nbytes: int, index: int, dtype: torch.dtype,
                    size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    table = getattr(_loading, "table", None)
    if table is None:
        raise RuntimeError("stoker: a reused segment arrived outside a worker's reply")
    storage = table.rebuild(seg_id, nbytes, _loading.fds[index] if index >= 0 else None)
    return rebuilt_as_torch(storage, dtype, 0, size, stride)


class MainOwnedSegments:
    """Segments the main process makes and writes itself (NOTE [ Gathers read the workers'
    starting copy ] in ``engine.main_gathers``): an allocator (``empty``) whose tensors are
    what a worker's batch arrives as (``MainSegments.rebuild`` of a new segment's fd), reused
    once ``MainSegments.settle`` finds nothing holds them."""

    def __init__(self) -> None:
        self._table = MainSegments()
        self._free: dict[int, list[int]] = {}  # nbytes -> ids nothing holds
        self._nbytes: dict[int, int] = {}  # id -> nbytes, while the table keeps it
        self._next_id = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s
        if nbytes == 0:  # torch's empty segment is not worth matching: the worker makes it
            raise ValueError("an empty batch tensor")
        free = self._free.get(nbytes)
        if not free:
            self._settle()
            free = self._free.get(nbytes)
        if free:
            storage = self._table.rebuild(free.pop(), nbytes, None)
        else:
            seg_id, self._next_id = self._next_id, self._next_id + 1
            made = _base_new_shared(_UntypedStorage, nbytes)
            fd, _ = made._share_fd_cpu_()
            storage = self._table.rebuild(seg_id, nbytes, fd)  # maps it again, as torch's
            del made  # rebuild does in the main process; this mapping and its fd go
            self._nbytes[seg_id] = nbytes
        # stoker's own tensor: the one handed out is made at next() by torch's rebuild's calls
        # (``engine.main_gathers.handed_out``), so these are torch's C functions
        return _set(_empty((0,), dtype=dtype), storage, 0, shape)

    def _settle(self) -> None:
        for i in self._table.settle():
            if i < 0:
                self._nbytes.pop(~i, None)
                continue
            free = self._free.setdefault(self._nbytes[i], [])
            if len(free) < _MAX_FREE_PER_SIZE:
                free.append(i)
            else:
                self._table.drop([i])
                del self._nbytes[i]

    def end_epoch(self) -> None:
        """Forget every segment nothing holds (between epochs only the user's batches keep
        memory, as under torch); those still held are forgotten by their holders' end."""
        self._table.end_epoch()
        self._free.clear()
        kept = set(self._table._table)
        self._nbytes = {i: n for i, n in self._nbytes.items() if i in kept}
