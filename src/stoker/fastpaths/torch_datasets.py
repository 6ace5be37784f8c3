"""torch's own dataset classes, batched: a batch of ``TensorDataset`` rows as one gather.

NOTE [ torch's own datasets ]
For ``TensorDataset``, ``StackDataset``, ``Subset`` and ``ConcatDataset`` (and a bare tensor
used as a dataset) stoker knows all the code a batch runs: torch's ``__getitem__`` /
``__getitems__`` of these classes, torch's fetcher and ``default_collate``. Where every part
below holds, a batch is computed as one ``index_select`` per tensor (``torch_gather``), by
default (it is one of the fast paths of NOTE [ One switch for the fast paths ]: ``fast_paths=
False`` or ``STOKER_FAST_PATHS=0`` turns it off), in workers and with ``num_workers=0``.
Each condition is why the batch is the one ``default_collate([dataset[i] for i in idx])``
(or of ``dataset.__getitems__(idx)``) gives:

* the loader: map-style, auto-batching, ``collate_fn`` torch's ``default_collate`` (or
  stoker's, or the partial stoker runs for it with ``slab_transport``) whose map still has
  torch's keys in torch's order and torch's (or stoker's) tensor function, no error policy,
  no ``worker_init_fn`` (``allowed``). So the collate that would run is torch's walk of
  tuples, lists and dicts and ``torch.stack`` of tensors, and no user code runs in a worker;
* the dataset: every node's type is exactly one of these classes (a subclass may override
  anything) and its ``__getitem__``, ``__getitems__`` and ``__len__`` are torch's own functions
  (checked by module and qualified name, each batch: a class patched at run time declines),
  with no ``__getitems__`` on the instance; a ``Subset``'s indices a list, tuple or range of
  exact ints; a ``StackDataset``'s datasets a tuple or dict, a ``TensorDataset``'s tensors a
  tuple or list. These methods have no side effects and draw no random numbers, so not
  calling them leaves nothing different behind (and the batch needs no seeding);
* every tensor: exactly ``torch.Tensor``, on the CPU, strided, contiguous, at least 1-d, of a
  plain dtype (bool, integer, floating, complex), not requiring grad (in a worker torch's
  ``stack(out=)`` raises for it: the per-sample path keeps that error), no conj/neg bit.
  A row of a contiguous tensor is contiguous, so ``torch.stack`` of rows and ``index_select``
  both give a new contiguous tensor of shape ``(len(idx), *row)`` with the same values,
  strides, offset 0 and storage size; in a worker the output is allocated as torch's
  ``collate_tensor_fn`` allocates it (a new shared-memory storage), or in the batch's slab;
* the indices: a list of exact ``int`` (not bool, numpy ints or tensors), non-empty, each in
  ``[0, len)`` of every node on its way (a tensor's first dimension, a ``Subset``'s indices, a
  ``ConcatDataset``'s ``cumulative_sizes``), so no index wraps and none raises. The batch's
  samples then have one structure (a ``ConcatDataset``'s parts must agree in structure, dict
  keys and order, and each tensor's dtype and row shape), which is what ``default_collate``
  checks: tuples become lists, dicts keep the first sample's key order;
* no ``TorchFunctionMode``/``TorchDispatchMode`` is active (``with torch.device(...)`` would
  move the outputs of factory functions).
* the functions torch's path calls through names a program can rebind are torch's own
  (``torch_gather.torch_calls_stock``: ``torch.stack``, the collate module's ``collate``, the
  ``torch.Tensor`` methods ``collate_tensor_fn`` and the classes call): torch would call the
  program's version.

Anything else, and any exception on the way, is ``Decline``: the batch is fetched sample by
sample by the ordinary path, so what torch does (its result, or its error) is what the user
gets. ``tests/contract/test_differential_fuzz.py`` generates these classes (nested, with
odd tensors, indices and samplers) and compares everything a program can observe.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset, TensorDataset
from torch.utils.data._utils import collate as _torch_collate

from stoker._core.specs import FetchSpec
from stoker._core.torch_own import torchs_own
from stoker.fastpaths.batched_columns import Decline
from stoker.fastpaths.torch_gather import gather, stock

__all__ = ["Decline", "allowed", "batched_for", "collate_map", "default_map", "stock", "tree_of"]

_MAP_KEYS = (torch.Tensor, np.ndarray, (np.bool_, np.number, np.object_), float, int, str, bytes)


def tree_of(ds: Any, depth: int = 0) -> bool:
    """The whole dataset is a tree of torch's classes over tensors (shape only: the batch
    checks the rest)."""
    if depth > 32 or not stock(ds):
        return False
    cls = type(ds)
    if cls is torch.Tensor or cls is TensorDataset:
        return True
    if cls is Subset:
        return tree_of(ds.dataset, depth + 1)
    children = ds.datasets
    if isinstance(children, dict):
        children = list(children.values())
    return all(tree_of(c, depth + 1) for c in children)


def default_map(fn_map: Any) -> bool:
    """A collate map that walks tuples, lists and dicts and stacks tensors as torch's does."""
    if type(fn_map) is not dict or tuple(fn_map) != _MAP_KEYS:
        return False
    from stoker.collate import _leaves

    tensor_fn = fn_map[torch.Tensor]
    # torch's function, not whatever its module's name is bound to now (NOTE [ torch's own
    # functions ]); stoker's own cannot be rebound where the map holds it
    return (torchs_own(tensor_fn, _torch_collate, "collate_tensor_fn")
            or tensor_fn is _leaves.collate_tensor_fn)


def collate_map(collate_fn: Any) -> Any:
    """The map ``collate_fn`` reads, when it is a default collate; else None."""
    from stoker import collate as ours

    if torchs_own(collate_fn, _torch_collate, "default_collate"):
        return _torch_collate.default_collate_fn_map
    if collate_fn is ours.default_collate:
        return ours.default_collate_fn_map
    if (type(collate_fn) is functools.partial and collate_fn.func is ours.collate
            and not collate_fn.args and list(collate_fn.keywords) == ["collate_fn_map"]):
        return collate_fn.keywords["collate_fn_map"]
    return None


def allowed(spec: FetchSpec, worker_init_fn: Any) -> bool:
    """Whether this loader's batches may be gathered (module NOTE): the loader's half."""
    return bool(
        spec.fast_paths and spec.kind == "map" and spec.auto_collation
        and not spec.skip_errors and worker_init_fn is None
        and collate_map(spec.collate_fn) is not None and tree_of(spec.dataset)
    )


def batched_for(spec: FetchSpec, worker_init_fn: Any) -> Any:
    """The batch function for ``spec``'s dataset (indices -> the collated batch, or
    ``Decline`` where it cannot be exact), or None where the loader is not ``allowed``
    (NOTE [ torch's own datasets ])."""
    if not allowed(spec, worker_init_fn):
        return None

    dataset, fn_map_of = spec.dataset, functools.partial(collate_map, spec.collate_fn)

    def fetch(indices: Any) -> Any:
        fn_map = fn_map_of()
        if fn_map is None or not default_map(fn_map):
            raise Decline("the collate map changed")
        return gather(dataset, indices)

    return fetch
