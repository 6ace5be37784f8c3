"""Batched fetch for datasets that index like arrays: one ``dataset[indices]`` call per batch.

NOTE [ Vectorised fetch ]
Many in-memory datasets are thin wrappers over tensors or arrays (``{"x": self.x[i], "y":
self.y[i]}``). Called with a LongTensor of a batch's indices, such a ``__getitem__`` returns the
whole batch at once, with no per-sample Python at all. Whether a ``__getitem__`` does that
exactly cannot be measured: one that normalises by ``x / x.abs().max()`` reduces over the whole
batch, and agrees with the per-sample result only on batches that happen to be normalised
already. So ``dataset[index_tensor]`` is only tried for a dataset whose class promises it:
``stoker_tensor_index = True`` says that ``dataset[torch.tensor(indices)]`` returns what
``default_collate([dataset[i] for i in indices])`` returns. Even then it is checked: once the
concurrency tuner has found the fetches CPU-bound, on two batches (default collate,
auto-batching on, no ``__getitems__``, no error policy) the worker computes the batch both ways
and compares them leaf by leaf (type, dtype, shape, every value), after shaping the vectorised
result as ``default_collate`` would (plain tuples become lists, numeric arrays tensors). Any
difference, exception, warning, or draw from a global RNG means sample by sample forever after.

A ``__getitem__`` that is one expression over array attributes may instead have a batched form
read from its source (NOTE [ Batched getitem from source ]): exact by construction (it runs only
operations known to act per sample, and declines the rest), so it needs no promise. It runs no
user code, so it is tried first and from the first batch, in workers and with num_workers=0
alike, and compared with the plain path the same way. Both are fast paths behind NOTE [ One
switch for the fast paths ].
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from stoker._core.dataset_hooks import SupportsTensorIndex, declares
from stoker.collate._alloc import allocating_into
from stoker.fastpaths.batched_getitem import compile_batched
from stoker.sampling import global_rngs
from stoker.sampling.dataset_rngs import find_dataset_rngs, restore_states, save_states

_PROBES = 2
_FAILED = object()


def shape_like_collate(obj: Any) -> Any:
    """Give a vectorised batch default_collate's container types."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc":
        return torch.as_tensor(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return [shape_like_collate(v) for v in obj]
    if isinstance(obj, tuple):
        return type(obj)(*(shape_like_collate(v) for v in obj))
    if isinstance(obj, list):
        return [shape_like_collate(v) for v in obj]
    if isinstance(obj, dict):
        return {k: shape_like_collate(v) for k, v in obj.items()}
    return obj


def same_batch(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and bool(
            torch.equal(a, b)
        )
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(same_batch(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str | bytes | int | float) or a is None:
        return bool(a == b)  # leaves of a list collated as it is (paths, names)
    return False  # custom types: not known to be equal


def declared_tensor_index(dataset: Any) -> bool:
    """The dataset's class promises ``dataset[tensor_of_indices]`` is its collated batch."""
    return declares(dataset, SupportsTensorIndex)


class VectorProbe:
    """Decides, from the first batches, whether a batch can be had in one call.

    Candidates, in order: the batched form read from ``__getitem__``'s source (probed from the
    first batch: it runs no user code), then ``dataset[index_tensor]`` (probed only once the
    caller says fetches are cheap and CPU-bound, as it does run user code). A candidate is
    adopted after ``_PROBES`` batches equal to the plain path's, and dropped at the first
    difference, exception, warning, global RNG draw or decline.
    """

    def __init__(
        self, dataset: Any, eligible: bool, direct: bool = True, trusted: bool = False,
        source: bool = False, torch_classes: Callable[[Any], Any] | None = None,
    ) -> None:
        """``trusted``: the batched form already passed its probes for this dataset (an
        earlier epoch of the same loader): adopt it without probing again. ``source``: the
        form read from the source may be tried (beyond torch: ``batched_getitem``, NOTE [ Same
        as torch unless asked ]); a declared ``stoker_tensor_index`` needs no more.
        ``torch_classes``: the gathers of torch's own dataset classes, exact by construction
        (NOTE [ torch's own datasets ]): adopted without probes, before any other."""
        self._dataset = dataset
        self._candidates: list[tuple[str, Callable[[list[int]], Any]]] = []
        if torch_classes is not None:
            self._candidates.append(("torch", torch_classes))
        if eligible:
            compiled = compile_batched(dataset) if source else None
            if compiled is not None:
                self._candidates.append(("source", compiled))
            if direct and declared_tensor_index(dataset):
                self._candidates.append(("call", self._call))
        self._left = _PROBES
        self.adopted = (trusted and self.kind == "source") or self.kind == "torch"
        self._owned_rngs: list[tuple[str, Any]] | None = None  # found at the first probe
        self._decided()

    @property
    def kind(self) -> str | None:
        """Which candidate is being probed or was adopted: "torch", "source", "call", or
        None."""
        return self._candidates[0][0] if self._candidates else None

    def _decided(self) -> None:
        # A plain attribute, read before every batch: no call once the probes are over.
        self.probing = not self.adopted and bool(self._candidates)

    @property
    def collates_objects(self) -> bool:
        """The source candidate's last batch collated per-sample objects (not gathers)."""
        fn = self._candidates[0][1] if self._candidates else None
        return bool(getattr(fn, "collates_objects", False))

    def wants_probe(self, cheap_cpu_bound: bool) -> bool:
        """Whether the next batch should be fetched both ways and compared."""
        return self.probing and (self.kind == "source" or cheap_cpu_bound)

    def _call(self, indices: list[int]) -> Any:
        return shape_like_collate(self._dataset[torch.as_tensor(indices)])

    def _drop(self) -> None:
        self._candidates.pop(0)
        self._left = _PROBES
        self._decided()

    def check(self, indices: list[int], collated: Any) -> None:
        """After fetching a batch the plain way: does the candidate give the same?

        The candidate call must leave no trace: the RNGs it drew from (global ones, and those
        the dataset owns) are put back, else every later draw of this process would shift
        (under ``seeding="per_worker"`` nothing reseeds them before the next batch).
        """
        fn = self._candidates[0][1]
        if self._owned_rngs is None:
            self._owned_rngs = find_dataset_rngs(self._dataset)
        before = global_rngs.snapshot()
        owned_before = pickle.dumps(save_states(self._owned_rngs))
        try:
            with warnings.catch_warnings(), allocating_into(None):
                warnings.simplefilter("error")
                candidate = fn(list(indices))
        except Exception:  # Decline included: a candidate that cannot show it agrees
            candidate = _FAILED
        drew = global_rngs.changed_since(before) or (
            pickle.dumps(save_states(self._owned_rngs)) != owned_before)
        if drew:
            global_rngs.restore(before)
            restore_states(self._owned_rngs, pickle.loads(owned_before))
        if candidate is _FAILED or drew or not same_batch(collated, candidate):
            self._drop()
            return
        self._left -= 1
        if self._left == 0:
            self.adopted = True
            self._decided()

    def fetch(self, indices: list[int]) -> Any:
        """The adopted candidate's batch; ``Decline``: fetch this one sample by sample."""
        return self._candidates[0][1](indices)
