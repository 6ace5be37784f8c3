"""Batches of torch's own dataset classes gathered in the main process, from a copy of the
dataset made as the workers start; a part of ``ProcessIterator``.

NOTE [ Gathers read the workers' starting copy ]
A batch of torch's own classes (NOTE [ torch's own datasets ]) is one ``index_select`` per
tensor, ~0.03 ms for 256 rows, but sending its task to a worker and its batch back costs the
two sides ~0.3 ms more. Gathering it in the main process from the dataset itself would read
the live tensors, where torch's workers read the copy their fork (or unpickling) made as they
started: a change made after ``iter()`` (in place, or through a numpy view that torch's
version counter does not see) would show. So, by default, when the loader qualifies:

* right before the first worker starts (where torch's workers take their copies: nothing of
  the user's runs between, the sampler is first asked after), the main process copies the
  dataset tree (``snapshot``): each node's own attributes, each tensor cloned once (aliases
  stay aliases), each ``Subset``'s indices and ``ConcatDataset``'s sizes copied. The copy lives
  as long as the workers it stands for (an epoch; persistent workers: the iterator), in memory
  a fork does not hand on, and goes with them, as their memory does. Only if the
  tree is torch's classes over plain tensors (every part of NOTE [ torch's own datasets ] the
  tree can show before a batch), its tensors take at most ``_MAX_COPY_BYTES`` and an
  eighth of the memory available, the workers are forked, and each tensor lies in memory a
  fork copies (NOTE [ Memory a fork copies ]): torch's workers read shared memory, file
  mappings, and (spawned or forkserved: pickling moves tensors into shared memory) every
  tensor live, seeing what the main process writes later. Nor when a torch function or
  dispatch mode is active as the workers fork, or the collate map or a function torch's
  path calls (``torch_calls_stock``) is not torch's then: the workers keep them as they were
  for their lives (the gathers do not look at the map again);
* each task is gathered from that copy when it is dispatched, with ``gather`` and its checks
  (a ``TensorDataset`` or a bare tensor without the walk over the nodes: ``_Rows``, whose
  checks of the nodes were made on the copy, which nothing else can change): what declines
  (an index negative or past the end, not an exact int, a mode active) goes to the worker
  torch's round-robin gives it, which runs it as before (its copy is the same), so its batch
  or its error is torch's. The task counts against that worker's depth until its turn to be
  handed out, so the sampler is asked as often and when it was. With ``in_order=False`` a
  task whose worker still has tasks to answer goes to that worker too: torch yields each
  worker's batches in the order it loads them;
* the batch's tensors are allocated as a worker's batch arrives in the main process: a storage
  made by torch's ``_new_shared_fd_cpu`` from a new segment's fd, of exactly the tensor's
  bytes, reused only when nothing holds it (``MainOwnedSegments``; the checks of NOTE
  [ torch's shared memory, reused ]);
* the tensors handed out are made at the ``next()`` that hands them out, by the calls torch's
  rebuild of a worker's batch makes there (``handed_out``: ``empty``, ``set_`` on the
  storage, ``requires_grad``), so the program's ``inference_mode``, grad mode and torch modes
  at that call, and the tensor's version counter, are those of torch's batch;
* the workers are started and stopped as before (forks, names, signals, at-fork hooks,
  ``_workers``) and sit idle; one that dies is reported as before, checked every
  ``DEATH_CHECK_EVERY`` batches (the loop that would notice it while waiting never waits).

The loader's half: NOTE [ torch's own datasets ]'s ``allowed`` (map-style, default collate,
no ``worker_init_fn``, no error policy, fast paths on), torch's ``file_descriptor`` sharing
strategy with reuse eligible, no ``slab_transport``, no ``stoker_fetch_for_batch``.
``fast_paths=False`` turns it off with the rest.
"""

from __future__ import annotations

import dataclasses
import mmap
from array import array
from typing import Any

import torch
from torch.utils.data import ConcatDataset, StackDataset, Subset, TensorDataset

from stoker._core.specs import FetchSpec
from stoker._core.torch_modes import unseen, watched
from stoker._core.torch_own import c_function, c_method
from stoker.collate._alloc import allocating_into
from stoker.engine.fork_private_memory import PrivateMemory
from stoker.fastpaths.torch_datasets import (
    Decline,
    allowed,
    batched_for,
    collate_map,
    default_map,
    tree_of,
)
from stoker.fastpaths.torch_gather import plain_tensor, stock, torch_calls_stock
from stoker.transport import reused_shm

_MAX_COPY_BYTES = 256 << 20
DEATH_CHECK_EVERY = 32
_INTS = {int}


class Gathered:
    """A task gathered here: the book holds it as a reply until its turn."""

    __slots__ = ("batch", "task_id")

    def __init__(self, task_id: int, batch: Any) -> None:
        self.task_id = task_id
        self.batch = batch


def handed_out(batch: Any) -> Any:
    """``batch``'s tensors made again over their storages, as torch's rebuild of a worker's
    batch makes them in the calling thread (module NOTE); what holds the storages is stoker's,
    unseen."""
    if isinstance(batch, torch.Tensor):
        with unseen():
            storage, offset = batch.untyped_storage(), batch.storage_offset()
            size, stride = batch.size(), batch.stride()
        return reused_shm.rebuilt_as_torch(storage, batch.dtype, offset, size, stride)
    if isinstance(batch, dict):
        return {k: handed_out(v) for k, v in batch.items()}
    return [handed_out(v) for v in batch]  # gather's batches: tensors, lists and dicts


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# torch's C functions and methods themselves: NOTE [ torch's own functions ]
_frombuffer, _aminmax = c_function("frombuffer"), c_function("aminmax")
_empty_like, _index_select = c_function("empty_like"), c_function("index_select")
_view, _copy = c_method("view"), c_method("copy_")


def _unforked_like(t: torch.Tensor) -> torch.Tensor:
    """An empty contiguous tensor like ``t`` in memory a fork does not give the child
    (``MADV_DONTFORK``): the workers forked after the copy never read it, and each fork would
    copy its page tables and mark its pages copy-on-write."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0 or not hasattr(mmap, "MADV_DONTFORK"):
        return _empty_like(t, memory_format=torch.contiguous_format)
    try:
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_DONTFORK)
        return _view(_frombuffer(buf, dtype=t.dtype, count=t.numel()), t.shape)
    except (OSError, ValueError, TypeError, RuntimeError):  # ordinary memory, then
        return _empty_like(t, memory_format=torch.contiguous_format)


class _Copier:
    """Copies a tree ``tree_of`` accepted; ``Decline`` where a part is not plain enough to
    copy exactly, or the copy would be too large."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.memory = PrivateMemory()
        self.nbytes = 0
        self.tensors: dict[int, torch.Tensor] = {}
        self.nodes: dict[int, Any] = {}

    def tensor(self, t: Any) -> Any:
        if not plain_tensor(t):
            raise Decline("a tensor the gather would not read")
        if not self.memory.holds(t.data_ptr(), t.numel() * t.element_size()):
            # NOTE [ Memory a fork copies ]: the workers would see its later changes
            raise Decline("a tensor in memory the workers share or map from a file")
        copied = self.tensors.get(id(t))
        if copied is None:
            self.nbytes += t.numel() * t.element_size()
            if self.nbytes > self.limit:
                raise Decline("the dataset's tensors are too large to copy")
            copied = self.tensors[id(t)] = _copy(_unforked_like(t), t)
        return copied

    @staticmethod
    def each(container: Any, copy: Any) -> Any:
        """An exact list, tuple or dict copied item by item; anything else as it is (the
        gather declines on it, as the worker's does)."""
        kind = type(container)
        if kind is dict:
            return {k: copy(v) for k, v in container.items()}
        if kind is list or kind is tuple:
            return kind(copy(v) for v in container)
        return container

    def node(self, ds: Any) -> Any:
        if id(ds) in self.nodes:
            return self.nodes[id(ds)]
        if not stock(ds):
            raise Decline("not one of torch's classes")
        cls = type(ds)
        if cls is torch.Tensor:
            return self.tensor(ds)
        copy = object.__new__(cls)
        state = dict(vars(ds))  # attributes the gather never reads stay shared: unread
        # Each container keeps its exact type: the gather accepts only some (a tuple of
        # tensors, a list of datasets...) and declines on the rest, here as in the worker.
        if cls is TensorDataset:
            state["tensors"] = self.each(ds.tensors, self.tensor)
        elif cls is Subset:
            state["dataset"] = self.node(ds.dataset)
            state["indices"] = self.each(ds.indices, lambda i: i)
        elif cls is ConcatDataset:
            state["datasets"] = self.each(ds.datasets, self.node)
            state["cumulative_sizes"] = self.each(ds.cumulative_sizes, lambda n: n)
        elif cls is StackDataset:
            state["datasets"] = self.each(ds.datasets, self.node)
        vars(copy).update(state)
        self.nodes[id(ds)] = copy
        return copy


def snapshot(dataset: Any, limit: int | None = None) -> Any | None:
    """A copy of ``dataset``'s tree as a worker starting now would hold it; None where the
    tree is not one to copy (module NOTE)."""
    if limit is None:
        available = _available_bytes()
        limit = _MAX_COPY_BYTES if available is None else min(_MAX_COPY_BYTES, available // 8)
    if not tree_of(dataset):
        return None
    try:
        return _Copier(limit).node(dataset)
    except Exception:  # Decline, or an odd attribute: the workers load it, as before
        return None


class _Rows:
    """A ``TensorDataset`` copy (or a bare tensor's) gathered without ``gather``'s walk: the
    copy is this process's alone, so what the walk checks of its nodes (torch's classes,
    plain tensors, a tuple or list of them) was checked once, when it was made; what depends
    on the batch (exact ints in range, no mode active) is checked as ``gather`` checks it, and
    the outputs are ``gather``'s: one ``index_select`` per tensor, in a list (a tensor for a
    bare tensor)."""

    def __init__(self, copy: Any) -> None:
        self.tensors: list[torch.Tensor] = [copy] if type(copy) is torch.Tensor else list(
            copy.tensors)
        self.listed = type(copy) is TensorDataset
        self.rows = min(t.shape[0] for t in self.tensors)

    @classmethod
    def of(cls, copy: Any) -> _Rows | None:
        if type(copy) is TensorDataset:
            tensors = copy.tensors
            if type(tensors) not in (tuple, list) or not tensors:
                return None
        elif type(copy) is torch.Tensor:
            tensors = (copy,)
        else:
            return None
        if not all(map(plain_tensor, tensors)):
            return None  # ``gather`` declines on these batches, and so does ``_Rows``
        return cls(copy)

    def __call__(self, indices: Any, segments: reused_shm.MainOwnedSegments) -> Any:
        if type(indices) is not list or not indices or set(map(type, indices)) != _INTS:
            raise Decline("the batch is not a non-empty list of ints")
        if watched():
            raise Decline("a torch mode is active or a profiler records: they see torch's calls")
        try:
            idx = _frombuffer(array("q", indices), dtype=torch.int64)
            lo, hi = _aminmax(idx)
            if int(lo) < 0 or int(hi) >= self.rows:
                raise Decline("an index out of range (or negative)")
            n = len(indices)
            outs = [_index_select(t, 0, idx, out=segments.empty((n, *t.shape[1:]), t.dtype))
                    for t in self.tensors]
        except Decline:
            raise
        except Exception as exc:  # as ``gather``: the worker's path gives torch's answer
            raise Decline(f"{type(exc).__name__}: {exc}") from exc
        return outs if self.listed else outs[0]


class MainGathers:
    """The copy, its batch function and the segments its batches are written into."""

    def __init__(self, fetch: Any, rows: _Rows | None) -> None:
        self._fetch = fetch
        self._rows = rows
        self.segments = reused_shm.MainOwnedSegments()
        self.count = 0

    @classmethod
    def for_loader(cls, spec: FetchSpec, worker_init_fn: Any, fetches_for_batch: bool,
                   start_method: str) -> MainGathers | None:
        """Made right before the first worker starts; None where the loader does not qualify
        (module NOTE)."""
        # Another start method pickles the dataset to the workers, which moves each tensor
        # into shared memory (torch's reductions): the workers would see what changes later.
        # A mode active now stays active in the forked workers (this thread's state is
        # theirs), however the main process's changes later; and so do the collate map and
        # the functions torch's path calls as they are now (no code of the user's runs in
        # them to change them).
        if (start_method != "fork" or watched() or not torch_calls_stock()
                or fetches_for_batch
                or not default_map(collate_map(spec.collate_fn))
                or "slab_transport" in spec.beyond
                or not allowed(spec, worker_init_fn) or not reused_shm.eligible()):
            return None
        copy = snapshot(spec.dataset)
        if copy is None:
            return None
        fetch = batched_for(dataclasses.replace(spec, dataset=copy), worker_init_fn)
        return None if fetch is None else cls(fetch, _Rows.of(copy))

    def batch(self, indices: Any) -> Any:
        """The batch at ``indices``, from the copy; ``Decline`` (the worker loads it)."""
        if self._rows is not None:
            batch = self._rows(indices, self.segments)
        else:
            with allocating_into(self.segments):
                batch = self._fetch(indices)
        self.count += 1
        return batch
