"""Whether ``worker_type="auto"`` loads a map-style dataset in the calling thread although
``num_workers > 0``.

NOTE [ Gathers need no workers ]
Workers earn their keep by running ``__getitem__`` away from the training loop. When a
dataset's ``__getitem__`` has a batched form read from its source (NOTE [ Batched getitem from
source ]), a batch is a few array gathers: computing it in the calling thread takes less of
that thread than receiving the same batch from a worker would, and needs no process start, no
shared memory, no copy of the dataset. So with ``worker_type="auto"`` (the default) such a
loader runs inline when all of these hold:

* map-style, auto-batching with the default collate, no ``__getitems__``, no error policy
  (``fetch.vectorisable``), and no ``worker_init_fn`` (it could set state ``__getitem__`` reads);
* on two probe batches (the first and the last indices) the batched form gives exactly
  ``default_collate`` of the samples, with no warning and no global RNG draw, and collates
  nothing but gathered arrays, Python numbers and strings (items of a list that are tensors
  or dicts make collating real work, better done in workers).

The batches are the ones workers would give: the form runs no user code and draws no random
numbers, and the plain ``__getitem__`` it stands for is a pure expression, so the few batches
it declines are fetched sample by sample in the calling thread with the same result. If the
iterator's own probes reject the form, the next epoch goes back to workers.
``worker_type="process"`` always starts workers. The decision is kept per loader and shown
by ``loader.stats()``.
"""

from __future__ import annotations

from typing import Any

from stoker._core.specs import FetchSpec
from stoker.fetch.fetchers import vectorisable

_PROBE_BATCH = 64  # samples per probe batch, at most


def _probe_batches(n: int, batch_size: int) -> list[list[int]]:
    k = max(1, min(n, batch_size, _PROBE_BATCH))
    return [list(range(k)), list(range(n - 1, n - 1 - k, -1))]


def gathers_suffice(spec: FetchSpec, worker_init_fn: Any, batch_size: int | None) -> bool:
    """Whether the batches of ``spec`` are best computed in the calling thread."""
    if worker_init_fn is not None:
        return False
    # The probe's module loads here, at the first pass that asks (NOTE [ Import only what the
    # loader needs ]).
    from stoker.fastpaths.index_tensor import VectorProbe

    probe = VectorProbe(spec.dataset, vectorisable(spec), direct=False, source=True)
    if probe.kind != "source":
        return False
    from stoker.collate import default_collate

    try:
        n = len(spec.dataset)
    except TypeError:
        return False
    for indices in _probe_batches(n, batch_size or 1) if n > 0 else []:
        try:  # the plain __getitem__ is a pure expression here (that is what compiled)
            plain = default_collate([spec.dataset[i] for i in indices])
        except Exception:
            return False  # the workers' plain path will raise it, as torch's would
        probe.check(indices, plain)
        if probe.kind != "source":
            return False  # the source form gave another batch: dropped, nothing left to check
    return probe.adopted and not probe.collates_objects
