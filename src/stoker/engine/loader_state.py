"""What the engine keeps on a loader from one epoch (one iterator) to the next.

NOTE [ Engine state ]
A ``DataLoader`` owns one ``EngineState`` and hands it to every iterator it makes; iterators
read and update it there, never the loader's own fields. It holds two kinds of things:

* portable: plain facts learnt about the dataset (which batched form passed its probes,
  whether batches are plain gathers, which skip messages were logged, whether the
  worker_init_fn warning was given). They travel when the loader is pickled or deep-copied.
* process-local: what belongs to this process's running engine (the stats accumulator, the
  memory watch, the list-sharing plan, the slab bank with its shared memory, the live
  progress of the epoch). They never travel: unpickling (``__setstate__``) builds new ones
  with ``_new_local_parts``, as a new loader has them (NOTE [ Loader pickling ] in
  ``stoker.loader``).
"""

from __future__ import annotations

import warnings
from typing import Any

from stoker._core.forked_copies import finalize_here
from stoker.engine.stats import NoStats, StatsAccumulator
from stoker.sharing.auto_share import ListSharing
from stoker.transport.slab_bank import SlabBank


def _memory_watch(dataset: Any, stats: StatsAccumulator) -> Any:
    """A watch of the workers' memory, telling its advice to ``stats``; its module loads with
    the first loader that has workers (NOTE [ Import only what the loader needs ])."""
    from stoker.profile.memory_watch import MemoryWatch

    return MemoryWatch(dataset, tell=stats.advise)


_LOCAL = ("progress", "stats", "memory_watch", "list_sharing", "slab_bank")


class EngineState:
    """One per loader, shared by its iterators (NOTE [ Engine state ])."""

    def __init__(
        self, dataset: Any, num_workers: int, collect_stats: bool, fast_paths: bool = True
    ) -> None:
        self.dataset = dataset
        self.num_workers = num_workers
        self.collect_stats = collect_stats
        self.fast_paths = fast_paths  # NOTE [ One switch for the fast paths ]
        # -- portable ------------------------------------------------------------------------
        self.skip_logged: set[Any] = set()  # on_error="skip": messages logged once
        self.inline: bool | None = None  # NOTE [ Gathers need no workers ]; None: not asked
        self.inline_told = False  # the INFO line that batches load inline was logged
        self.vector_trusted: Any = None  # the dataset whose batched form passed its probes
        self.init_fn_seeds_told = False  # NOTE [ Seeds set in worker_init_fn stay ]
        self._new_local_parts()

    def _new_local_parts(self) -> None:
        """The process-local parts, as a new loader has them."""
        self.progress: Any = None  # the live ``EpochProgress`` of the last epoch begun
        self.stats = (StatsAccumulator if self.collect_stats else NoStats)(self.num_workers)
        self.memory_watch = (
            _memory_watch(self.dataset, self.stats) if self.num_workers > 0 else None)
        self.list_sharing = ListSharing(self.fast_paths)
        self.slab_bank = SlabBank()  # NOTE [ Slabs outlive workers ]
        finalize_here(self, self.slab_bank.close)

    def fit_workers(self, num_workers: int) -> None:
        """A pass with another ``num_workers`` than the last (the attribute was set since):
        the stats count that many workers from now on, hooks and timeline kept."""
        if num_workers == self.num_workers:
            return
        self.num_workers = num_workers
        old = self.stats
        self.stats = type(old)(num_workers).carry_over(old)
        if num_workers > 0 and self.memory_watch is None:
            self.memory_watch = _memory_watch(self.dataset, self.stats)

    def add_stats_hook(self, hook: Any) -> None:
        self.stats.hooks = (*self.stats.hooks, hook)

    def remove_stats_hook(self, hook: Any) -> None:
        self.stats.hooks = tuple(h for h in self.stats.hooks if h is not hook)

    def warn_init_fn_seeds_once(self, lightning: bool = False) -> None:
        """NOTE [ Seeds set in worker_init_fn stay ] in ``workers.lifecycle``: said once per
        loader, when a worker reports that its worker_init_fn seeded the global RNGs. When it
        is the one Lightning installs, the warning names Lightning and its switch."""
        if self.init_fn_seeds_told:
            return
        self.init_fn_seeds_told = True
        if lightning:
            warnings.warn(
                "Lightning's seed_everything(workers=True) gave this loader a worker_init_fn "
                "(pl_worker_init_function) that seeds the global RNGs (random, numpy, torch) in "
                "each worker, so stoker leaves them to it: each worker draws from its own "
                "stream, as with torch, the augmentations depend on num_workers, and a saved "
                "state resumes only with the same num_workers. seeding=\"per_batch\" already "
                "gives every batch its own seeded streams, the same for any num_workers; to "
                "have that, call seed_everything(seed, workers=False). To keep Lightning's "
                "per-worker seeding without this warning, pass seeding=\"per_worker\".",
                stacklevel=2,
            )
            return
        warnings.warn(
            "worker_init_fn seeded the global RNGs (random, numpy or torch), so stoker leaves "
            "them to it: each worker draws from its own stream, as with torch, and the "
            "augmentations depend on num_workers. The per-batch seeding you asked for "
            "(seeding=\"per_batch\" or beyond_torch) already gives every batch its own seeded "
            "streams, the same for any num_workers; to have that, drop the seeding from "
            "worker_init_fn. To keep torch's behaviour without this warning, leave seeding "
            "to its default.",
            stacklevel=2,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _LOCAL}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._new_local_parts()
