"""The frozen plan of one pass: every decision the engine acts on, and why.

NOTE [ One plan ]
``iter(loader)`` (and ``state_dict``/``load_state_dict``) first turns the loader's arguments,
the dataset's declared capabilities and the machine into one ``Plan``; the engine (its
iterators, the device feed, the state checks) reads the plan and the loader's ``EngineState``,
never the loader. So what the engine depends on is written down here, and when it is read is
plain: a plan is made at each ``iter()``, from the arguments as they are then (an argument
reassigned between epochs counts from the next ``iter()``, as in torch). A persistent
iterator keeps what its workers were started with (torch's workers keep their fork) and takes
from each new plan only what torch's ``_reset`` reads again: the epoch's facts
(``iterations``, ``len_reported``, ``skip_budget``).

``loader.plan()`` returns the plan a new ``iter()`` would act on; ``print(loader.plan())``
shows each decision with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from stoker._core import beyond_torch
from stoker._core.specs import FetchSpec

Executor = Literal["calling_thread", "threads", "processes"]


@dataclass(frozen=True)
class Decision:
    """One choice of the plan: its name, the value taken and why."""

    name: str
    value: Any
    why: str

    def __str__(self) -> str:
        return f"{self.name} = {self.value!r}: {self.why}"


@dataclass(frozen=True)
class Plan:
    """What one pass of a ``stoker.DataLoader`` does (NOTE [ One plan ])."""

    # -- what is loaded --------------------------------------------------------------------
    fetch: FetchSpec  # the dataset, its kind, the collate that runs, skip policy, beyond set
    index_sampler: Any  # torch's: the batch sampler with auto-collation, else the sampler
    sampler: Any
    batch_sampler: Any
    batch_size: int | None
    generator: Any
    collate_fn: Callable[[Any], Any]  # the loader's own (the fetch spec's may be stoker's)
    # -- who loads it ----------------------------------------------------------------------
    executor: Executor
    worker_type: str
    num_workers: int
    prefetch_factor: int | None
    persistent_workers: bool
    in_order: bool
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    multiprocessing_context: Any
    worker_concurrency: int | str
    stall_warning_s: float | None
    dist: Any  # stoker.distributed.DistContext, read as the pass starts
    # -- seeding, delivery -----------------------------------------------------------------
    seeding: Literal["per_batch", "per_worker"]
    main_rngs: bool  # NOTE [ Main streams resume ]: the state keeps the main process's RNGs
    pin_memory: bool
    pin_memory_device: str
    feed: Any  # device.feed.FeedSpec, or None: batches stay on the CPU
    pad_steps: Callable[[], int] | None  # shard_even="exact": every rank's step count
    # -- the epoch's facts (read again by a persistent iterator) --------------------------
    skip_budget: int | float
    iterations: int  # passes begun before this one (DistributedSampler.set_epoch's count)
    len_reported: int | None  # torch's _IterableDataset_len_called: the len() given, if asked
    decisions: tuple[Decision, ...] = field(default=(), compare=False)

    @property
    def dataset(self) -> Any:
        """The dataset the pass reads."""
        return self.fetch.dataset

    @property
    def kind(self) -> str:
        """``"map"`` or ``"iterable"``: the dataset's kind."""
        return self.fetch.kind

    @property
    def beyond(self) -> frozenset[str]:
        """What the pass does beyond torch (``beyond_torch``, with what it implies)."""
        return self.fetch.beyond

    def __str__(self) -> str:
        lines = [f"stoker plan for {type(self.dataset).__name__} ({self.kind}-style):"]
        lines += [f"  {d}" for d in self.decisions]
        return "\n".join(lines)


def plan_decisions(
    *, fetch: FetchSpec, executor: Executor, executor_why: str, seeding: str,
    seeding_given: bool, num_workers: int, prefetch_factor: int | None, concurrency: int | str,
    main_rngs: bool, feed: Any, pin_memory: bool, beyond_given: Any,
) -> tuple[Decision, ...]:
    """Each decision of a pass with its reason, in the order a batch meets them."""
    beyond = fetch.beyond
    if beyond_given is None:
        source = f"from {beyond_torch.ENV}" if beyond else "nothing asked"
    else:
        source = f"beyond_torch={beyond_given!r}"
    beyond_why = source + (": every default is torch's" if not beyond else
                           " (what each one does: docs/same_as_torch.md)")
    out = [
        Decision("beyond_torch", sorted(beyond), beyond_why),
        Decision("executor", executor, executor_why),
        Decision("seeding", seeding, (
            "seeding= given" if seeding_given else
            "per_batch_seeding (beyond torch)" if seeding == "per_batch" else
            "torch's: each worker seeded once with base seed + worker id") + (
            "; the state keeps the main process's global RNGs (num_workers=0)"
            if main_rngs else "")),
    ]
    if executor == "processes":
        deep = "deep_prefetch" in beyond and seeding == "per_batch" and fetch.kind == "map"
        out.append(Decision("prefetch_factor", prefetch_factor, (
            "up to 8 small batches per worker (deep_prefetch)" if deep else
            "torch's: batches in flight per worker")))
        slabs = "slab_transport" in beyond
        out.append(Decision("transport", "slabs" if slabs else "torch's", (
            "slab_transport (beyond torch): collated into reused shared-memory slabs"
            + (", implied by device= / keep_slabs" if slabs and "slab_transport" not in (
                beyond_torch.resolve(beyond_given)) else "")
            if slabs else
            "your collate_fn runs in the workers; batches cross as torch's do")))
    if executor != "calling_thread" or num_workers > 0:
        out.append(Decision("worker_concurrency", concurrency, (
            "one sample at a time per worker unless the dataset declares stoker_thread_safe"
            if concurrency == "auto" else "samples fetched at once per worker, as given")))
    out.append(Decision("fast_paths", fetch.fast_paths, (
        "exact fast paths on (fast_paths=False turns them off)" if fetch.fast_paths
        else "off (fast_paths=False or STOKER_FAST_PATHS=0)")))
    out.append(Decision("on_error", "skip" if fetch.skip_errors else "raise", (
        "a failing sample is left out and counted" if fetch.skip_errors else
        "torch's: a failing sample's error is raised")))
    if feed is not None:
        out.append(Decision("device", str(feed.device), (
            f"batches copied to the device {feed.ahead} ahead on a side stream")))
    elif pin_memory:
        out.append(Decision("pin_memory", True, "torch's: batches copied into pinned memory"))
    return tuple(out)
