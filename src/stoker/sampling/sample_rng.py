"""Per-sample random generators that do not depend on which thread or process runs the sample.

Inside a stoker loader, ``__getitem__`` can call ``stoker.sample_rng()`` (a numpy
``Generator``) or ``stoker.sample_generator()`` (a ``torch.Generator``); both are seeded from
(base seed, epoch, sample index), so augmentations drawn from them are identical with any
``num_workers``, any ``worker_concurrency``, threads or processes, and after a resume. Unlike
the global RNGs they are safe to use from concurrent fetches, so a dataset that draws only
from them can declare ``stoker_thread_safe = True`` and get concurrent fetches.

NOTE [ A stream's samples have no index ]
An ``IterableDataset``'s samples come out of its iterator: no index names the one being made,
and its position in a worker's stream depends on ``num_workers``, so the loader publishes no
per-sample seed there. While it reads an iterable dataset it publishes ``STREAM`` instead, so
that a call says what to use in a stream rather than that it was made outside a loader. A
stream that knows its samples can seed them itself (``with_sample_seed``): ``TarShardStream``
seeds its ``transform`` from (its seed, its epoch, the sample's shard and key), the same under
any loader, ``num_workers``, shuffle and resume.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stoker.sampling.seeds import mix_seed

# Per thread: ``base``, ``epoch`` (set per batch) and ``index`` (set per sample, in fetch
# loops directly, ~40 ns) of the sample being loaded; ``index`` is None outside a fetch, or
# ``CURSOR`` while a batch's loop publishes its list iterator in ``cursor`` instead.
SAMPLE_CONTEXT = threading.local()

# NOTE [ The sample index from the batch's iterator ]
# Publishing each sample's index before calling ``__getitem__`` costs a thread-local write and
# an explicit loop per sample, ~15 us per batch of 256, paid whether or not the dataset ever
# asks. With the fast paths on, a fetch loop over a list instead publishes its list iterator
# once per batch and runs a plain comprehension; ``sample_seed()`` reads the iterator's
# position only when called: a list iterator's ``__reduce__`` gives (iter, (list,), next
# position), so the sample being loaded is ``list[position - 1]``.
CURSOR = object()
STREAM = object()  # NOTE [ A stream's samples have no index ]

_OUTSIDE = (
    "stoker.sample_seed()/sample_rng()/sample_generator() only work while a stoker "
    "DataLoader is loading a sample (inside Dataset.__getitem__). Outside a loader, create "
    "your own generator, e.g. numpy.random.default_rng(seed)."
)
_IN_STREAM = (
    "stoker.sample_seed()/sample_rng()/sample_generator() seed from the index of the sample "
    "being loaded, and an IterableDataset's samples have none (they come out of its "
    "iterator). In an IterableDataset, make one generator per worker in __iter__, e.g. "
    "numpy.random.default_rng(torch.initial_seed()) (torch seeds each worker differently, and "
    "the main process at num_workers=0), and draw from it; or use a map-style dataset. "
    "TarShardStream's transform may call them: it seeds each sample from its shard and key."
)


def _cursor_works() -> bool:
    """Does this interpreter's list iterator report its position as described above?"""
    try:
        iterator = iter([7, 8, 9])
        next(iterator), next(iterator)
        return iterator.__reduce__()[2] == 2  # type: ignore[misc]
    except Exception:
        return False


CURSOR_WORKS = _cursor_works()


def _cursor_index(ctx: Any) -> Any:
    items, iterator = ctx.cursor
    reduced = iterator.__reduce__()
    position = reduced[2] if len(reduced) > 2 else len(items)
    return items[position - 1]


def set_sample_context(base_seed: int, epoch: int, index: Any) -> None:
    ctx = SAMPLE_CONTEXT
    ctx.base, ctx.epoch, ctx.index = base_seed, epoch, index


def clear_sample_context() -> None:
    SAMPLE_CONTEXT.index = None


def _index_word(index: Any) -> int:
    if isinstance(index, int):
        return index & 0xFFFFFFFF
    return zlib.crc32(repr(index).encode())  # not hash(): str hashing differs per process


def sample_seed() -> int:
    """A 64-bit seed for the sample being loaded in this thread."""
    index = getattr(SAMPLE_CONTEXT, "index", None)
    if index is CURSOR:
        index = _cursor_index(SAMPLE_CONTEXT)
    if index is None or index is STREAM:
        raise RuntimeError(_OUTSIDE if index is None else _IN_STREAM)
    return mix_seed(SAMPLE_CONTEXT.base, SAMPLE_CONTEXT.epoch, _index_word(index), 7)


def with_sample_seed(fn: Callable[[Any], Any], arg: Any, base_seed: int, epoch: int,
                     index: Any) -> Any:
    """``fn(arg)`` with ``sample_seed()`` seeded for sample ``index`` of a stream that knows
    its samples (NOTE [ A stream's samples have no index ]); the context around it restored."""
    ctx = SAMPLE_CONTEXT
    saved = getattr(ctx, "base", None), getattr(ctx, "epoch", None), getattr(ctx, "index", None)
    ctx.base, ctx.epoch, ctx.index = base_seed, epoch, index
    try:
        return fn(arg)
    finally:
        ctx.base, ctx.epoch, ctx.index = saved


def sample_rng() -> np.random.Generator:
    """A numpy Generator seeded for this sample (deterministic under any executor)."""
    return np.random.default_rng(sample_seed())


def sample_generator() -> torch.Generator:
    """A torch CPU Generator seeded for this sample (deterministic under any executor)."""
    return torch.Generator().manual_seed(sample_seed() & ((1 << 63) - 1))
