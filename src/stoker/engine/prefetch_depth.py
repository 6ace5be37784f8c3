"""How many tasks a worker may hold at once.

NOTE [ Deeper prefetch for small batches ]
torch keeps prefetch_factor tasks per worker; a worker that has finished them idles until
the main process yields a batch, and with in-order delivery that waits for the slowest
worker. On a busy machine this left tiny-batch workers idle a third of the time. When
batches are small, that depth costs almost no memory, so a worker may hold up to
_SMALL_BATCH_DEPTH tasks as long as they fit in _SMALL_BATCH_BUDGET bytes. prefetch_factor
stays the floor (and the exact depth for larger batches). Batches do not change, but the
sampler is drawn further ahead of the loop than torch draws it, and the dataset sees samples
earlier, which a sampler or dataset that reads the loop's progress can tell: so it is beyond
torch, ``deep_prefetch`` (NOTE [ Same as torch unless asked ]).
"""

from __future__ import annotations

_SMALL_BATCH_DEPTH = 8
_SMALL_BATCH_BUDGET = 16 << 20


def depth_for(
    prefetch: int, step_samples: int, concurrency: int, batch_bytes: int,
    small_batches: bool = True,
) -> int:
    """Enough tasks to keep a worker's concurrent fetches busy (batches of samples in flight
    + one), and more for small batches (``deep_prefetch``, beyond torch); never below
    ``prefetch``."""
    depth = max(prefetch, -(-concurrency // step_samples) + 1)
    if small_batches and batch_bytes * _SMALL_BATCH_DEPTH <= _SMALL_BATCH_BUDGET:
        depth = max(depth, _SMALL_BATCH_DEPTH)
    return depth
