"""Fetchers: turn an index, a batch of indices, or the next iterable items into a batch.

Semantics follow torch's fetchers: ``__getitems__`` is used when truthy; an iterable dataset's
last partial batch is dropped when ``drop_last``; an exhausted iterable raises
``StopIteration`` and stays exhausted. One deliberate difference: a ``StopIteration`` escaping a
map-style ``__getitem__`` is an error here, where torch silently ends the epoch.

With ``on_error="skip"`` a map fetcher loads samples one by one when the batch fails, leaves
out the ones that raise, and reports them as ``Skipped`` (index, error text) next to the batch.
An error that says the process ran out of a resource (``MemoryError``, ``OSError`` ENOMEM,
EMFILE, ENFILE, ENOSPC) is not a bad sample: it is raised, never skipped (``skippable``).

NOTE [ The sample that raised ]
An error note names the sample index whose ``__getitem__`` raised, not only its batch. The
fetch loops pay nothing for it on success: a batch's loop runs over a list iterator, and only
when an exception escapes is the iterator's position read (the index it had just handed out)
and recorded with the exception's identity, per thread (``note_failed_index``); the
per-sample loop (``explore``) and the thread pool's ``settle`` know the index already. Never
set on the exception (the user's exception keeps exactly its own attributes; builtin ones
take no weak reference either), the record holds no reference to it: it is cleared when a
fetch starts and when read, and read only in the thread that fetched, where the note is
written (the worker's reply, the main process's notes), so an identity it names is the
exception it was made for. A ``__getitems__`` dataset or a ``collate_fn`` is handed the whole
batch: no single index is known there.

NOTE [ torch's fetchers call the dataset ]
torch's fetcher objects (``torch.utils.data._utils.fetch``) make the calls into the dataset:
``__getitem__`` from their list comprehension, ``__getitems__``, ``iter()`` and ``next()`` on an
iterable, collating nothing (``_as_fetched``); and ``collate_fn``, from a second fetcher
whose dataset hands back the samples it is given (``torch_collate``). So what a dataset or a
collate function sees of its callers is torch's: a warning with ``stacklevel=2`` (or ``3``
from ``__getitem__``, under torch's list comprehension) is attributed to torch's ``fetch.py``
line (its text, its ``module=`` filters, its once-per-location registry), and
``hasattr(dataset, "__getitems__")`` is asked at every batch, as torch asks it. The fetcher's
``fetch`` is called from a copy of torch's own line that calls it (``torch_voice.at_torch_call``:
``_worker_loop``'s in a worker, ``_next_data``'s in the main process): one level more is
torch's too. So are ``next()`` on the sampler (``_next_index``'s line, ``engine.cursor``) and
``worker_init_fn`` (``_worker_loop``'s, ``workers.lifecycle``). Above those frames the callers
are stoker's. The sample index a note names, and ``stoker.sample_rng()``'s, are read from
the iterator the fetcher is handed.
"""

from __future__ import annotations

import errno
import functools
import operator
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info
from torch.utils.data._utils.fetch import _IterableDatasetFetcher, _MapDatasetFetcher

from stoker._core.dataset_hooks import SupportsPrepareBatch, held, provided
from stoker._core.specs import FetchSpec
from stoker._core.torch_voice import FETCH_IN_MAIN_CALL, FETCH_IN_WORKER_CALL, at_torch_call
from stoker.sampling.sample_rng import CURSOR, CURSOR_WORKS, SAMPLE_CONTEXT, STREAM


@dataclass(frozen=True)
class Skipped:
    index: Any
    error: str  # "TypeName: message"


_RESOURCE_ERRNOS = frozenset({errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ENOSPC})


def skippable(exc: BaseException) -> bool:
    """Whether ``on_error="skip"`` may leave out a sample that raised ``exc``: an ``Exception``
    that is not the process running out of memory, file descriptors or disk."""
    if not isinstance(exc, Exception) or isinstance(exc, MemoryError):
        return False
    return not (isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS)


# Per thread: (id of the exception, the index it was raised for) of the last sample that
# raised in this thread's fetch loops (NOTE [ The sample that raised ]).
_FAILED_AT = threading.local()
UNKNOWN = object()  # failed_index() of an exception raised for no single known sample


def note_failed_index(exc: BaseException, index: Any) -> None:
    """Record that ``exc`` escaped from loading sample ``index`` in this thread."""
    _FAILED_AT.record = (id(exc), index)


def forget_failed_index() -> None:
    _FAILED_AT.record = None


def failed_index(exc: BaseException) -> Any:
    """The sample index ``exc`` was raised for, or ``UNKNOWN``; read once, in the thread whose
    fetch raised it."""
    record = getattr(_FAILED_AT, "record", None)
    _FAILED_AT.record = None
    return record[1] if record is not None and record[0] == id(exc) else UNKNOWN


def _note_position(exc: BaseException, index: Any, iterator: Any) -> None:
    """``exc`` escaped while ``iterator`` (over ``index``) was at the failing sample."""
    if type(index) is list or type(index) is tuple:
        position = len(index) - operator.length_hint(iterator) - 1
        if 0 <= position < len(index):
            note_failed_index(exc, index[position])


class EmptyBatch:
    """Every sample of the batch was skipped: there is nothing to deliver for this step."""


EMPTY = EmptyBatch()


def _stop_iteration_error(exc: StopIteration) -> RuntimeError:
    # torch lets this end the epoch early without a word; like PEP 479 for generators, a
    # StopIteration leaking out of __getitem__ is a bug to report.
    err = RuntimeError(
        "StopIteration raised by the map-style dataset (or collate_fn) while loading this "
        "batch. A map-style dataset ends where len(dataset) says; raising StopIteration "
        "would silently cut the epoch short, so stoker stops here. Raise IndexError (or fix "
        "__len__) instead."
    )
    err.__cause__ = exc
    return err


def _as_fetched(data: Any) -> Any:
    """The collate torch's fetchers are given (NOTE [ torch's fetchers call the dataset ])."""
    return data


class _Fetching:
    """What torch's ``_next_data`` line reads its fetcher from (``self._dataset_fetcher``)."""

    __slots__ = ("_dataset_fetcher",)

    def __init__(self, fetcher: Any) -> None:
        self._dataset_fetcher = fetcher


def _as_torch_calls(fetcher: Any) -> Callable[[Any], Any]:
    """``fetcher.fetch`` called from torch's line that calls it: ``_worker_loop``'s in a
    worker, ``_next_data``'s in the main process (NOTE [ torch's fetchers call the dataset ])."""
    if get_worker_info() is not None:
        at = at_torch_call(*FETCH_IN_WORKER_CALL)
        if at is not None:
            return functools.partial(at, fetcher)
    else:
        at = at_torch_call(*FETCH_IN_MAIN_CALL)
        if at is not None:
            return functools.partial(at, _Fetching(fetcher))
    return fetcher.fetch  # type: ignore[no-any-return]


class _Given:
    """The "dataset" of the torch fetcher that collates: hands back the samples given."""

    __slots__ = ()

    def __getitem__(self, data: Any) -> Any:
        return data


def torch_collate(collate_fn: Any) -> Callable[[Any], Any]:
    """``collate_fn`` as torch's fetcher calls it, from its ``fetch`` (NOTE [ torch's fetchers
    call the dataset ])."""
    return _as_torch_calls(_MapDatasetFetcher(_Given(), False, collate_fn, False))


def _published(ctx: Any, iterator: Any) -> Any:
    """``iterator``'s indices, each published to ``stoker.sample_rng()`` as it is handed out
    (a generator is suspended while the dataset runs: no frame of it sits above the call)."""
    for i in iterator:
        ctx.index = i
        yield i
    ctx.index = None


def _custom_lookup(cls: type) -> bool:
    """Whether ``cls`` answers attribute lookups itself (its own ``__getattr__`` or
    ``__getattribute__``): it may provide names a static lookup does not find."""
    return any("__getattr__" in vars(c) or "__getattribute__" in vars(c)
               for c in cls.__mro__ if c is not object)


def getitems_of(dataset: Any) -> Callable[[Any], Any] | None:
    """The dataset's ``__getitems__`` where truthy (torch's test), found without the program's
    ``__getattr__`` unless its class answers lookups itself (it may provide it): the lookups a
    dataset sees are torch's per-batch one (NOTE [ torch's fetchers call the dataset ]), plus
    this one only where the class could answer."""
    found = held(dataset, "__getitems__")
    if found is None and _custom_lookup(type(dataset)):
        found = getattr(dataset, "__getitems__", None)
    return found if found else None


class MapFetcher:
    def __init__(self, spec: FetchSpec, skip_errors: bool = False) -> None:
        self._dataset = spec.dataset
        # NOTE [ torch's fetchers call the dataset ]
        self._torch_fetch = _as_torch_calls(_MapDatasetFetcher(
            spec.dataset, spec.auto_collation, _as_fetched, spec.drop_last))
        self._collate = torch_collate(spec.collate_fn)
        self._auto = spec.auto_collation
        self._skip = skip_errors
        self.fast_paths = spec.fast_paths  # NOTE [ One switch for the fast paths ]
        self._getitems: Callable[[Any], Any] | None = getitems_of(spec.dataset)
        # A dataset may ask to see a batch's indices before its samples are read, e.g. to
        # fetch what they need from storage at once (stoker.formats.TarShards).
        self._prepare = provided(spec.dataset, SupportsPrepareBatch.stoker_prepare_batch)
        self._announced: set[Any] = set()  # tasks whose batch the dataset has seen ahead
        self.upcoming: list[tuple[Any, Any]] = []  # (task, indices) waiting after this one
        self.skipped: list[Skipped] = []  # of the last fetch
        # (base seed, epoch) of the batch being fetched: each sample's index is published
        # to stoker.sample_rng() before it is loaded. None: not published.
        self.sample_context: tuple[int, int] | None = None

    def get_one(self, index: Any) -> Any:
        """One sample (for per-sample executors); ``__getitems__`` datasets get a list of one."""
        if self._getitems is not None:
            return self._getitems([index])[0]
        return self._dataset[index]

    def each(self, indices: Any) -> list[Any]:
        """One sample per index ``indices`` hands out, loaded by torch's fetcher (NOTE [ torch's
        fetchers call the dataset ]); ``splittable`` fetchers only."""
        try:
            return self._torch_fetch(indices)  # type: ignore[no-any-return]
        except StopIteration as exc:
            raise _stop_iteration_error(exc) from exc

    def get_one_checked(self, index: Any) -> Any:
        try:
            return self.get_one(index)
        except StopIteration as exc:
            raise _stop_iteration_error(exc) from exc

    @property
    def splittable(self) -> bool:
        """Whether samples can be fetched one by one (not through ``__getitems__``)."""
        return self._auto and self._getitems is None

    def samples(self, index: list[Any]) -> list[Any]:
        fetch = self._torch_fetch  # NOTE [ torch's fetchers call the dataset ]
        if self._getitems is not None:
            self._mark(index, batch=True)
            return fetch(index)
        iterator = iter(index)
        try:  # NOTE [ The sample that raised ]
            if self.sample_context is None:
                return fetch(iterator)  # type: ignore[no-any-return]
            ctx = self._publish()
            if self.fast_paths and CURSOR_WORKS and type(index) is list:
                # NOTE [ The sample index from the batch's iterator ] in sampling.sample_rng
                ctx.cursor, ctx.index = (index, iterator), CURSOR
                try:
                    return fetch(iterator)  # type: ignore[no-any-return]
                finally:
                    ctx.cursor = ctx.index = None
            return fetch(_published(ctx, iterator))  # type: ignore[no-any-return]
        except BaseException as exc:
            _note_position(exc, index, iterator)
            raise

    def _publish(self) -> Any:
        ctx = SAMPLE_CONTEXT
        ctx.base, ctx.epoch = self.sample_context  # type: ignore[misc]
        return ctx

    def _mark(self, index: Any, batch: bool = False) -> None:
        """Publish the index of what is fetched now; a batch handed whole to ``__getitems__``
        as a tuple of its indices, where reading them consumes nothing: the dataset gets the
        very object the batch sampler yielded, as torch's fetcher gives it (a key of the
        dataset's own, an iterator)."""
        if self.sample_context is None:
            return
        if batch and isinstance(index, (list, tuple)):
            index = tuple(index)
        self._publish().index = index

    # NOTE [ Batches announced ]
    # A dataset defining stoker_prepare_batch(indices) sees each batch's indices before its
    # samples are read (TarShards starts the batch's shard downloads together). A worker also
    # shows it the batches of tasks already waiting in its socket (prefetch_factor - 1 of
    # them) right after the current one (whose needs go first), so their downloads overlap
    # this batch's reads instead of starting when it ends. The hook only prepares: the
    # samples are read by __getitem__ as always, so what a batch holds does not change. An
    # error in an announce is dropped here: the batch's own call, made again when it runs,
    # raises it there.

    def announce(self, task: Any, index: Any) -> None:
        """Show a waiting task's batch (``task``: its (epoch, id)) to the dataset's hook,
        once (NOTE [ Batches announced ])."""
        if self._prepare is None or not self._auto or task in self._announced:
            return
        if len(self._announced) > 1024:  # tasks long done
            self._announced.clear()
        self._announced.add(task)
        try:
            self._prepare(index)
        except Exception:
            pass

    def prepare_batch(self, index: Any) -> None:
        """Show the batch, then the waiting ones, to the dataset's hook (NOTE [ Batches
        announced ]); the per-sample paths call it themselves, ``gather`` does."""
        if self._prepare is not None and self._auto:
            self._prepare(index)
            for task, ahead in self.upcoming:  # after this batch's: its needs go first
                self.announce(task, ahead)
        self.upcoming = []

    def gather(self, index: Any) -> Any:
        """The batch's samples (a single sample when auto-batching is off), or ``EMPTY``."""
        self.skipped = []
        forget_failed_index()
        try:
            if not self._auto:
                self._mark(index)
                return self._torch_fetch(index)
            self.prepare_batch(index)
            try:
                return self.samples(index)
            except Exception as exc:
                if not self._skip or not skippable(exc):
                    raise
                forget_failed_index()
                kept = self._samples_skipping(index)
                return kept if kept else EMPTY
        except StopIteration as exc:
            err, raised_at = _stop_iteration_error(exc), failed_index(exc)
            if raised_at is not UNKNOWN:
                note_failed_index(err, raised_at)
            raise err from exc
        except Exception as exc:
            if self._skip and not self._auto and skippable(exc):
                self.skipped = [Skipped(index, error_text(exc))]
                return EMPTY
            raise
        finally:
            if self.sample_context is not None:
                SAMPLE_CONTEXT.index = None

    def finish(self, data: Any) -> Any:
        """Collate gathered samples (``EMPTY`` stays ``EMPTY``)."""
        if data is EMPTY:
            return EMPTY
        try:
            return self._collate(data)
        except StopIteration as exc:
            raise _stop_iteration_error(exc) from exc
        except RuntimeError as exc:
            explain_collate_error(data, exc)
            raise

    def fetch(self, index: Any) -> Any:
        return self.finish(self.gather(index))

    def _samples_skipping(self, index: list[Any]) -> list[Any]:
        kept = []
        for i in index:
            try:
                self._mark(i)
                kept.append(self.get_one(i))
            except StopIteration as exc:
                err = _stop_iteration_error(exc)
                note_failed_index(err, i)
                raise err from exc
            except Exception as exc:
                if not skippable(exc):
                    note_failed_index(exc, i)
                    raise
                self.skipped.append(Skipped(i, error_text(exc)))
        return kept


def explain_collate_error(samples: Any, exc: RuntimeError) -> None:
    """A collate that failed on samples whose tensors sit on different devices: raise
    ``MixedDeviceError`` naming them (louder than torch, on a failure only)."""
    from stoker.collate._leaves import raise_if_mixed_devices_in
    from stoker.errors import MixedDeviceError

    if not isinstance(exc, MixedDeviceError):
        raise_if_mixed_devices_in(samples)


def error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


class IterableFetcher:
    """Reads an iterable dataset; while its code runs, ``stoker.sample_rng()`` says what to use
    in a stream (NOTE [ A stream's samples have no index ] in ``sampling.sample_rng``)."""

    def __init__(self, spec: FetchSpec) -> None:
        SAMPLE_CONTEXT.index = STREAM
        try:  # NOTE [ torch's fetchers call the dataset ]: iter() and next() are its
            self._torch = _IterableDatasetFetcher(
                spec.dataset, spec.auto_collation, _as_fetched, spec.drop_last)
        finally:
            SAMPLE_CONTEXT.index = None
        self._torch_fetch = _as_torch_calls(self._torch)
        self._collate = torch_collate(spec.collate_fn)
        self.skipped: list[Skipped] = []

    splittable = False
    sample_context: tuple[int, int] | None = None

    def fetch(self, index: Any) -> Any:
        return self.finish(self.gather(index))

    def finish(self, data: Any) -> Any:
        try:
            return self._collate(data)
        except RuntimeError as exc:
            explain_collate_error(data, exc)
            raise

    def iterator_state(self) -> tuple[Any, bool]:
        """``iter(dataset)``'s own ``state_dict()`` (None without one) and whether it ended:
        it raised StopIteration filling the last (short) batch, so the epoch ends at the next
        step without asking it again (torchdata's fetcher "ended")."""
        state = getattr(self._torch.dataset_iter, "state_dict", None)
        return (state() if callable(state) else None), self._torch.ended

    def load_iterator_state(self, saved: Any, ended: bool) -> None:
        """torchdata's order: the dataset's state was loaded and ``iter(dataset)`` made; now the
        iterator's own state, so the stream continues where it was instead of being re-read."""
        load = getattr(self._torch.dataset_iter, "load_state_dict", None)
        if saved is not None and callable(load):
            load(saved)
            self._torch.ended = ended

    upcoming: list[tuple[Any, Any]] = []  # an iterable's samples are not named by index

    def gather(self, index: Any) -> Any:
        """torch's fetcher's samples: an ended stream, or a batch that ends it short under
        ``drop_last``, raises ``StopIteration`` as torch's does."""
        SAMPLE_CONTEXT.index = STREAM  # NOTE [ A stream's samples have no index ]
        try:
            return self._torch_fetch(index)
        finally:
            SAMPLE_CONTEXT.index = None


def vectorisable(spec: FetchSpec) -> bool:
    """Whether a vectorised fetch may be probed for (NOTE [ Vectorised fetch ])."""
    from torch.utils.data import _utils

    from stoker.collate import collate, default_collate

    dataset = spec.dataset
    collate_fn = spec.collate_fn
    default = collate_fn in (default_collate, _utils.collate.default_collate) or getattr(
        collate_fn, "func", None) is collate
    return (
        spec.fast_paths and spec.kind == "map" and spec.auto_collation and default
        and not spec.skip_errors and not _custom_lookup(type(dataset))
        and not held(dataset, "__getitems__")
    )


def source_form(spec: FetchSpec) -> bool:
    """Whether the batched form read from ``__getitem__``'s source may be tried: beyond torch
    (``batched_getitem``, or ``inline_gathers``, which loads with it; NOTE [ Same as torch
    unless asked ]): it stops calling ``__getitem__`` per sample."""
    return bool(spec.beyond & {"batched_getitem", "inline_gathers"}) and vectorisable(spec)


def make_fetcher(spec: FetchSpec) -> MapFetcher | IterableFetcher:
    return MapFetcher(spec, spec.skip_errors) if spec.kind == "map" else IterableFetcher(spec)
