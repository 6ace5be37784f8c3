"""Checks of the arguments stoker's ``DataLoader`` adds to torch's, run in its constructor
before any work: each error names the argument, the value and what it takes. torch's own
arguments are checked by torch's constructor, with torch's messages.

NOTE [ torch's errors, with a note ]
Where torch's own check of an argument fails, stoker raises torch's error, same type and
text, so code catching it still does; where that text does not name the argument or the fix
(``random_()``'s for ``generator=0``, an ``AssertionError`` naming torch's iterator class for
``prefetch_factor=0``, Python's for a misspelt keyword), a note (``add_note``) does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.utils.data

from stoker._core import beyond_torch as beyond
from stoker._core.notes import add_note

_SEEDINGS = ("per_batch", "per_worker")
_WORKER_TYPES = ("auto", "process", "thread")
_SHARD_EVENS = ("pad", "drop", "exact")


def check_arguments(
    dataset: Any, *, seeding: Any, beyond_torch: Any, snapshot_every_n_steps: Any,
    stall_warning_s: Any, shard_even: Any, on_error: Any, skip_budget: Any, worker_type: Any,
    worker_concurrency: Any,
) -> None:
    if seeding is not None and seeding not in _SEEDINGS:
        raise ValueError(
            f"seeding={seeding!r}: expected one of {_SEEDINGS}, or None (torch's "
            "per-worker seeding unless beyond_torch turns on per_batch_seeding)."
        )
    beyond.resolve(beyond_torch)  # a bad name fails here
    _check_snapshot_steps(snapshot_every_n_steps)
    if stall_warning_s is not None and not stall_warning_s > 0:
        raise ValueError(
            f"stall_warning_s={stall_warning_s!r}: expected a positive number of seconds, "
            "or None to never warn."
        )
    if shard_even not in _SHARD_EVENS:
        raise ValueError(f"shard_even={shard_even!r}: expected one of {_SHARD_EVENS}.")
    _check_error_policy(dataset, on_error, skip_budget)
    _check_executor(dataset, worker_type, worker_concurrency)


def _check_executor(dataset: Any, worker_type: str, concurrency: int | str) -> None:
    if worker_type not in _WORKER_TYPES:
        raise ValueError(f"worker_type={worker_type!r}: expected one of {_WORKER_TYPES}.")
    if worker_type == "thread" and isinstance(dataset, torch.utils.data.IterableDataset):
        raise ValueError(
            "worker_type='thread' needs a map-style dataset: an IterableDataset shards itself "
            "by get_worker_info(), which is per process, so threads would all read the same "
            "stream. Use worker_type='process' (or 'auto') with num_workers > 0."
        )
    if concurrency != "auto" and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ValueError(
            f"worker_concurrency={concurrency!r}: expected a number of samples fetched at once "
            "per worker (int >= 1) or 'auto'."
        )


_ON_ERRORS = ("raise", "skip")


def _check_error_policy(dataset: Any, on_error: str, skip_budget: int | float) -> None:
    if on_error not in _ON_ERRORS:
        raise ValueError(f"on_error={on_error!r}: expected one of {_ON_ERRORS}.")
    if isinstance(skip_budget, bool) or not isinstance(skip_budget, (int, float)) or (
        skip_budget < 0
    ):
        raise ValueError(
            f"skip_budget={skip_budget!r}: expected a count of samples per epoch (int >= 0) "
            "or a fraction of the epoch's samples (float in [0, 1))."
        )
    if on_error == "skip" and isinstance(dataset, torch.utils.data.IterableDataset):
        raise ValueError(
            "on_error='skip' needs a map-style dataset: an IterableDataset's iterator usually "
            "cannot continue after it raises (a generator is closed by the exception), so "
            "skipping would silently end its stream. Catch the error inside __iter__ instead."
        )


def check_generator(generator: Any) -> None:
    """torch draws each iterator's base seed with ``random_(generator=generator)`` at
    ``iter()``: anything but a ``torch.Generator`` raises that call's ``TypeError`` (naming
    ``generator``) there, so stoker makes the same call at the same moment, before anything
    reads the generator's state."""
    if generator is not None and not isinstance(generator, torch.Generator):
        try:
            torch.empty((), dtype=torch.int64).random_(generator=generator)
        except TypeError as exc:  # NOTE [ torch's errors, with a note ]
            seed = generator if isinstance(generator, int) and not isinstance(
                generator, bool) else "seed"
            add_note(exc,
                f"stoker: generator={generator!r} ({type(generator).__name__}) is not a "
                "torch.Generator: the loader draws its shuffle order and its workers' base "
                f"seed from it. Pass generator=torch.Generator().manual_seed({seed}) for a "
                "seeded run, or leave generator=None.")
            raise


def note_iterator_check(exc: AssertionError, prefetch_factor: Any) -> None:
    """A note on torch's worker iterator's own check of ``prefetch_factor`` (its
    ``AssertionError``, raised as torch raises it: NOTE [ torch's errors, with a note ])."""
    if str(exc).startswith("prefetch_factor must be greater than 0"):
        add_note(exc,
            f"stoker: prefetch_factor={prefetch_factor!r}: with num_workers > 0 each worker "
            "keeps prefetch_factor batches loading ahead of the loop, so it must be 1 or "
            "more; leave it None for torch's default of 2.")


_Init = TypeVar("_Init", bound=Callable[..., None])


def explain_unknown_keywords(init: _Init) -> _Init:
    """``init`` (``DataLoader.__init__``) with a note on the ``TypeError`` Python raises for a
    keyword it does not take: the argument meant ("did you mean num_workers?"). The error is
    Python's (torch's constructor raises the same text); its signature is ``init``'s."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError as exc:
            tb = exc.__traceback__
            if tb is not None and tb.tb_next is None:  # raised binding the call, not inside
                _note_unknown(exc, init, type(self).__name__, kwargs)
            raise

    return cast(_Init, __init__)  # type checkers keep ``init``'s signature


def _note_unknown(exc: TypeError, init: Callable[..., None], owner: str,
                  kwargs: dict[str, Any]) -> None:
    import difflib
    import inspect

    params = inspect.signature(init).parameters
    names = [n for n, p in params.items() if n != "self" and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in (k for k in kwargs if k not in names):
        close = difflib.get_close_matches(name, names, n=1)
        add_note(exc,
            f"stoker: {owner} takes no argument {name!r}: did you mean {close[0]}?" if close
            else f"stoker: {owner} takes no argument {name!r}; its arguments are "
            f"{', '.join(names)} (help(stoker.DataLoader) describes each).")


def _check_snapshot_steps(steps: Any) -> None:
    # torchdata takes 0 and None alike: no periodic snapshot (its own tests use 0).
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
        raise ValueError(
            f"snapshot_every_n_steps={steps!r}: expected a number of steps (int >= 0) or None, "
            "as torchdata's StatefulDataLoader takes; stoker's state is exact after every step "
            "whatever the value."
        )
