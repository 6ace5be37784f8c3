"""Does the user's ``__getitem__`` draw from the global RNGs? Seen, in the doctor's process.

The thread opt-ins (``worker_concurrency``, ``worker_type="thread"``, ``stoker_thread_safe``)
rest on the promise that ``__getitem__`` is thread-safe and draws randomness only from
``stoker.sample_rng()`` (NOTE [ Automatic concurrency ] in ``fetch/concurrency.py``). A dataset
that draws from ``random``, numpy's global RNG or torch's default generator breaks it: with
several fetches at once its augmentations would depend on thread timing. So before it proposes
one, the doctor calls ``dataset[i]`` for a few indices here, comparing the three states before
and after each call (and putting them back, so the probe leaves the process's streams as they
were). A draw seen is a fact; none seen is only "not seen" (a draw that happens one sample in
a hundred can be missed), which the report words as such.
"""

from __future__ import annotations

from typing import Any

from stoker.sampling import global_rngs

PROBE_SAMPLES = 8


def draws_global_rng(dataset: Any, samples: int = PROBE_SAMPLES) -> bool | None:
    """True if ``dataset[i]`` drew from a global RNG for one of the first few indices spread
    over the dataset; False if none did; None if the dataset cannot be probed (iterable,
    no length, or ``__getitem__`` raised)."""
    try:
        n = len(dataset)
    except TypeError:
        return None
    if n <= 0 or not hasattr(dataset, "__getitem__"):
        return None
    indices = sorted({(k * n) // samples for k in range(min(samples, n))})
    saved = global_rngs.snapshot(raw=False)
    try:
        for i in indices:
            before = global_rngs.snapshot()
            dataset[i]
            if global_rngs.changed_since(before):
                return True
    except Exception:  # the run itself will report the dataset's own errors
        return None
    finally:
        global_rngs.restore(saved)
    return False
