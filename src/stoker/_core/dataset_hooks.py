"""What a dataset may tell stoker's loader: the ``stoker_*`` hooks, one protocol each.

NOTE [ Dataset hooks ]
stoker's loader reads seven optional ``stoker_*`` attributes of the dataset it is given;
torch's DataLoader reads none, so a dataset defining them runs unchanged under both. Each is
one protocol below, the one place its name is written: stoker reads them only through
``declares``, ``flag`` and ``provided`` (``tests/unit/test_contracts.py`` fails on a
``stoker_*`` name probed anywhere else, or not declared here). They are read as plain
attributes of the dataset object (its class's or its own, whichever ``getattr`` finds): a
flag counts only when it ``is True`` (``stoker_share_lists`` also when it ``is False``: a
refusal), a method when it is not ``None``. So the protocols are not ``runtime_checkable``:
``isinstance`` would count ``stoker_thread_safe = False`` as the promise. Flags are promises
about the dataset's code (its class), not measurements: stoker checks what it can, trusts the
rest. Hooks that only prepare (downloads, an epoch) never change which samples a batch holds,
and an exception they raise is dropped: the batch's own reads raise and report it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class SupportsTensorIndex(Protocol):
    """A map-style dataset that indexes like an array: ``stoker_tensor_index = True``.

    The promise: ``dataset[torch.tensor(indices)]`` returns exactly what
    ``default_collate([dataset[i] for i in indices])`` would. stoker then may fetch a batch with
    that one call instead of one ``__getitem__`` per sample, once the fetches are found
    CPU-bound and two batches computed both ways agree leaf by leaf (any difference, exception,
    warning or global RNG draw means sample by sample after). Only with the default collate,
    automatic batching and no ``__getitems__``; never with ``fast_paths=False``."""

    stoker_tensor_index: bool


class SupportsThreadSafe(Protocol):
    """A dataset whose ``__getitem__`` may run on several threads at once:
    ``stoker_thread_safe = True``.

    The promise: concurrent ``__getitem__`` calls are safe and draw randomness only from
    ``stoker.sample_rng()``/``sample_generator()``, never the global RNGs. stoker then may
    fetch a worker's samples on a thread pool (``worker_concurrency="auto"`` tunes how many at
    once from measured throughput) instead of one at a time as torch does."""

    stoker_thread_safe: bool


class SupportsShareLists(Protocol):
    """A dataset that says how its large plain lists reach forked workers:
    ``stoker_share_lists = True`` asks for sharing, ``False`` refuses it.

    With ``True``, under ``fork``, each large list of plain data the dataset holds is seen in
    workers through a read-only stand-in over one shared copy (no copy-on-read per worker), as
    ``beyond_torch`` naming ``shared_lists`` asks. The promise: code in workers does not rely on
    such a list being ``type list``. ``False`` keeps the lists as torch does even when
    ``beyond_torch`` asks."""

    stoker_share_lists: bool


class SupportsPrepareBatch(Protocol):
    """A map-style dataset that wants to see each batch's indices before its samples are read
    (e.g. to start the batch's downloads together): ``stoker_prepare_batch(indices)``.

    stoker calls it in the worker (or the main process with ``num_workers=0``) with a batch's
    indices before that batch is fetched, then with those of batches already waiting for the
    worker; only with automatic batching. The promise: it only prepares, so the samples are
    the same without it (torch never calls it); an exception it raises ahead of a batch is
    dropped, while one raised for the batch being fetched fails that batch."""

    def stoker_prepare_batch(self, indices: list[int]) -> None:
        """Prepare to read the samples at ``indices``."""
        ...


class SupportsFetchForBatch(Protocol):
    """A map-style dataset that fetches for its workers in the main process:
    ``stoker_fetch_for_batch(indices)`` (NOTE [ The main process fetches for its workers ] in
    ``stoker.storage.prefetch_threads``).

    With ``num_workers > 0`` stoker calls it in the main process with each batch's indices as
    it sends the batch to a worker (a list of one index without automatic batching). The
    promise: the samples are the same without it; an exception it raises is dropped."""

    def stoker_fetch_for_batch(self, indices: list[int]) -> None:
        """Start fetching what the samples at ``indices`` need, for the worker reading them."""
        ...


class SupportsFetchForStream(Protocol):
    """An iterable dataset that fetches for its workers in the main process:
    ``stoker_fetch_for_stream(worker_id, num_workers, samples)`` (NOTE [ The main process
    fetches for its workers ] in ``stoker.storage.prefetch_threads``).

    With ``num_workers > 0`` stoker calls it in the main process each time it asks worker
    ``worker_id`` (of ``num_workers``) for a batch, with the samples asked of that worker so
    far this epoch. The promise: the samples are the same without it; an exception it raises
    is dropped."""

    def stoker_fetch_for_stream(self, worker_id: int, num_workers: int, samples: int) -> None:
        """Start fetching what worker ``worker_id`` reads up to its ``samples``-th sample."""
        ...


class SupportsEpoch(Protocol):
    """A dataset whose epoch its persistent workers' copies should follow: ``stoker_epoch()``
    (NOTE [ A dataset's epoch on persistent workers ] in ``stoker.engine.process_iter``).

    With every new epoch of persistent workers, stoker calls it on the main process's copy and
    passes the value to each worker's copy's ``set_epoch`` (which the dataset must have);
    torch's persistent workers keep the epoch they started with. Called only if callable."""

    def stoker_epoch(self) -> int:
        """The epoch set on this (the main process's) copy."""
        ...


HOOKS: tuple[type, ...] = (
    SupportsTensorIndex, SupportsThreadSafe, SupportsShareLists, SupportsPrepareBatch,
    SupportsFetchForBatch, SupportsFetchForStream, SupportsEpoch,
)


def _declared(protocol: type) -> str:
    names = {n for n in (*vars(protocol).get("__annotations__", {}), *vars(protocol))
             if n.startswith("stoker_")}
    if len(names) != 1:
        raise TypeError(f"{protocol.__name__} declares {sorted(names)}: one hook per protocol")
    return names.pop()


_NAMES = {protocol: _declared(protocol) for protocol in HOOKS}


def hook_name(protocol: type) -> str:
    """The ``stoker_*`` attribute ``protocol`` (one of ``HOOKS``) declares."""
    return _NAMES[protocol]


def held(obj: object, name: str) -> Any:
    """``obj``'s attribute ``name`` as ``getattr`` gives it, or None, found without asking the
    program's ``__getattr__`` (its instance dict, its class and slots only): torch's loader
    never asks a dataset for stoker's names, and a delegating ``__getattr__`` that logs or
    counts must not see them."""
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return None
    return getattr(obj, name, None)


def flag(dataset: object, protocol: type) -> object:
    """The value of a flag hook on ``dataset`` as it is (``None`` when it has none)."""
    return held(dataset, _NAMES[protocol])


def declares(dataset: object, protocol: type) -> bool:
    """Whether ``dataset`` makes a flag hook's promise: the attribute ``is True``."""
    return held(dataset, _NAMES[protocol]) is True


def provided(
    dataset: object, method: Callable[Concatenate[Any, _P], _R]
) -> Callable[_P, _R] | None:
    """``dataset``'s own (bound) method for a hook, named by the protocol's function
    (``provided(ds, SupportsPrepareBatch.stoker_prepare_batch)``), or ``None`` without one."""
    found: Callable[_P, _R] | None = held(dataset, method.__name__)
    return found
