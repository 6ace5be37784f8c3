"""``stoker.DataLoader``: torch's DataLoader interface on stoker's engine.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): the constructor, its validation and
error messages, ``len()``, frozen attributes and the generic alias are torch's own, so code that
checks ``isinstance(loader, torch.utils.data.DataLoader)`` (Lightning, Accelerate) keeps working.
Iteration is stoker's (``engine``), and so are ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, TypeVar

import torch.utils.data

from stoker._core import beyond_torch as beyond
from stoker._core.arguments import check_arguments, check_generator, explain_unknown_keywords
from stoker._core.loader_doc import DOC, OnError, Seeding, ShardEven, WorkerType
from stoker.fastpaths.switch import enabled as fast_paths_enabled

# NOTE [ Import only what the loader needs ]: the engine, the state checks and the sampling
# parts load when a loader is first built, iterated or saved, not at ``import stoker``.
if TYPE_CHECKING:
    from stoker._core.plan import Executor, Plan
    from stoker._core.specs import FetchSpec
    from stoker._core.stats import LoaderStats, StatsHook
    from stoker.distributed.context import DistContext
    from stoker.engine.base_iter import BaseIterator
    from stoker.engine.loader_resume import ResumeFacts
    from stoker.profile.events import EventRecorder
    from stoker.sampling.sharded import ShardedSampler

T_co = TypeVar("T_co", covariant=True)


# NOTE [ A subclass's names ]
# A program that changed its import keeps its own DataLoader subclass, whose attributes may
# take a name stoker adds (``self.plan = "warmup"``). stoker's own code reaches its methods
# through the class (``DataLoader.plan(self)``), and ``dist_context`` is computed on each read
# by a descriptor an instance attribute of the same name overrides, so the subclass's
# attribute is its own and stoker runs as before.
class _ReadNow:
    """An attribute computed on each read, which an instance attribute of the same name
    overrides (a non-data descriptor: assigning it is not refused, as a property's is)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else self.fn(obj)


def _dist_context() -> DistContext:
    from stoker.distributed.context import detect

    return detect()


def _is_sharded(sampler: Any) -> TypeGuard[ShardedSampler]:
    from stoker.sampling.sharded import ShardedSampler

    return isinstance(sampler, ShardedSampler)


def _injected_distributed(sampler: Any, batch_sampler: Any) -> bool:
    """shard=True with a DistributedSampler given: a framework (Lightning) rebuilt the loader
    with its own; it already splits across ranks, so it is kept in place of stoker's."""
    return batch_sampler is None and isinstance(
        sampler, torch.utils.data.DistributedSampler
    )


class DataLoader(torch.utils.data.DataLoader[T_co]):
    __doc__ = DOC  # the arguments stoker adds, each explained (``_core/loader_doc.py``)

    @explain_unknown_keywords  # NOTE [ torch's errors, with a note ]
    def __init__(
        self,
        dataset: torch.utils.data.Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: torch.utils.data.Sampler | Iterable | None = None,
        batch_sampler: torch.utils.data.Sampler[list] | Iterable[list] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[T_co]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        seeding: Seeding | None = None,
        beyond_torch: bool | Iterable[str] | None = None,
        stall_warning_s: float | None = 300.0,
        shard: bool = False,
        shard_even: ShardEven = "pad",
        on_error: OnError = "raise",
        skip_budget: int | float = 0.01,
        worker_type: WorkerType = "auto",
        worker_concurrency: int | Literal["auto"] = "auto",
        fast_paths: bool = True,
        collect_stats: bool = True,
        device: str | torch.device | None = None,
        device_prefetch: int = 1,
        device_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        check_arguments(  # stoker's own arguments, before any work (torch's: by torch)
            dataset, seeding=seeding, beyond_torch=beyond_torch,
            snapshot_every_n_steps=snapshot_every_n_steps, stall_warning_s=stall_warning_s,
            shard_even=shard_even, on_error=on_error, skip_budget=skip_budget,
            worker_type=worker_type, worker_concurrency=worker_concurrency,
        )
        # NOTE [ What the loader lets go of first ]
        # A deleted loader drops its attributes in the order they were made. stoker's engine
        # state (and an inline iterator) also hold the dataset; made after torch's attributes,
        # they kept it past the others, so a program's objects with a __del__ went in another
        # order than torch's (dataset, worker_init_fn, sampler, collate_fn). Made first here,
        # they are dropped first, and each object goes at its own attribute, as under torch.
        self._engine: EngineState = None  # type: ignore[assignment]
        self._stoker_inline_iter: weakref.ref[Any] | None = None  # an iterable's, num_workers=0
        self.beyond_torch = beyond_torch  # NOTE [ Same as torch unless asked ]
        self.snapshot_every_n_steps = snapshot_every_n_steps
        # NOTE [ Batches on the device ]
        from stoker.device.attach import feed_spec  # NOTE [ Import only what the loader needs ]

        feed = feed_spec(device, device_prefetch, device_transform)
        self.worker_type = worker_type
        self.worker_concurrency = worker_concurrency
        self.fast_paths = fast_paths
        self._stoker_fast_paths = fast_paths_enabled(fast_paths)
        self.on_error = on_error
        self.skip_budget = skip_budget
        self.seeding = seeding
        self.stall_warning_s = stall_warning_s
        self.shard = shard
        self.shard_even = shard_even
        self._stoker_pad_steps: Callable[[], int] | None = None
        if shard and not isinstance(dataset, torch.utils.data.IterableDataset) and not (
            _injected_distributed(sampler, batch_sampler)
        ):
            from stoker.distributed.context import rank_share

            sampler = rank_share(dataset, sampler, batch_sampler, shuffle, generator, shard_even)
            shuffle = None
        self._stoker_iterations = 0  # epochs begun (drives DistributedSampler.set_epoch)
        self._stoker_resume: dict[str, Any] | None = None
        # By keyword: Lightning rebuilds a loader from the arguments torch's __init__ received
        # when stoker's __init__ was not wrapped (stoker first imported inside a dataloader
        # hook), and positional ones collide with the sampler it injects.
        super().__init__(
            dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
            pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        # After torch's own validation of num_workers (a bad value fails there, like torch).
        self._stoker_feed_spec = feed  # NOTE [ Batches on the device ]
        self.device = feed.device if feed is not None else None
        self.device_prefetch = device_prefetch
        self.device_transform = device_transform
        self.collect_stats = collect_stats
        from stoker.engine.loader_state import EngineState

        self._engine = EngineState(  # NOTE [ Engine state ]
            dataset, num_workers, collect_stats, self._stoker_fast_paths
        )
        from stoker._core.stats import loader_built  # loaded by EngineState's import already

        loader_built(self)  # hooks from above: `stoker doctor`'s agent in the script it runs
        if shard and shard_even == "exact" and _is_sharded(sampler):
            # A partial, not a lambda: the loader pickles (NOTE [ Loader pickling ]).
            self._stoker_pad_steps = functools.partial(
                sampler.num_batches, self.batch_size or 1, self.drop_last
            )

    @_ReadNow
    def dist_context(self) -> DistContext:
        """This process's rank and world size, read now (see ``stoker.distributed.detect``)."""
        return _dist_context()

    def __len__(self) -> int:
        if self._stoker_pad_steps is not None:
            return self._stoker_pad_steps()  # every rank takes the same number of steps
        return super().__len__()

    # -- pickling ----------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """NOTE [ Loader pickling ]: a loader pickles and deep-copies like torch's (Lightning's
        ddp_spawn, ``copy.deepcopy``). What belongs to a running engine stays behind: the
        iterator (its workers and sockets) and the process-local parts of the engine state
        (the epoch's live progress, the slab bank with shared memory and a lock: NOTE [ Engine
        state ]); the copy rebuilds them when it first iterates. A state loaded with
        ``load_state_dict`` and not applied yet travels with it."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_iterator", "_stoker_inline_iter")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # not setattr: torch freezes some attributes after __init__
        self._iterator = None
        self._stoker_inline_iter = None

    def __copy__(self) -> DataLoader:
        """``copy.copy`` makes what it makes of torch's loader: a new loader sharing every
        attribute (stoker's engine state too), the iterator of persistent workers included:
        both loaders then run those workers, as under torch, where a pickling copy (without
        the iterator, ``__getstate__``) would start its own. A subclass with its own pickling
        (``__getstate__``, ``__reduce__``...) is copied through it, as ``copy.copy`` does."""
        cls = type(self)
        if (cls.__getstate__, cls.__setstate__, cls.__reduce__, cls.__reduce_ex__) != (
                DataLoader.__getstate__, DataLoader.__setstate__, object.__reduce__,
                object.__reduce_ex__):
            reduced: Any = self.__reduce_ex__(4)
            rebuild, args, state = reduced[0], reduced[1], reduced[2] if len(reduced) > 2 else None
            copied = rebuild(*args)
            if state is not None:
                copied.__setstate__(state)
            return copied  # type: ignore[no-any-return]
        copied = cls.__new__(cls)
        copied.__dict__.update(self.__dict__)  # not setattr: torch freezes some attributes
        return copied

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> BaseIterator:  # type: ignore[override]
        if type(self)._get_iterator is not DataLoader._get_iterator:
            return self._subclass_iter()
        resume, self._stoker_resume = self._stoker_resume, None
        if resume is not None and not resume.get("sampler_state_applies", True):
            resume = {**resume, "sampler_state": None}  # NOTE [ Constant state keys ]
        from stoker.distributed import begin_epoch

        begin_epoch(self.sampler, self.batch_sampler,
                    autopilot="epoch_autopilot" in self._stoker_beyond)
        # worker_type="thread" keeps nothing between passes: its threads end with each epoch
        if self.persistent_workers and self.num_workers > 0 and self.worker_type != "thread":
            it = self._iterator
            if it is None or it.stopped or resume is not None:  # type: ignore[attr-defined]
                if it is not None:
                    it.shutdown()  # type: ignore[attr-defined]
                self._iterator = self._make_iterator(resume)
            else:
                it.reset(self._pass_plan())  # type: ignore[attr-defined]
            result = self._iterator
        else:
            result = self._make_iterator(resume)
        self._stoker_iterations += 1
        return result  # type: ignore[return-value]

    def _get_iterator(self) -> Any:
        return self._make_iterator(None)

    def _subclass_iter(self) -> Any:
        """A subclass that makes its own iterators (``_get_iterator`` overridden) gets them as
        torch's ``__iter__`` gets them: made anew each pass, or kept and ``_reset`` with
        persistent workers. What it makes is its own, so stoker's resume and epoch autopilot
        do not apply to it."""
        if self.persistent_workers and self.num_workers > 0:
            from stoker.engine.base_iter import BaseIterator

            it = self._iterator
            if it is None:
                self._iterator = self._get_iterator()
            elif isinstance(it, BaseIterator):  # stoker's, from super()._get_iterator()
                it.reset(self._pass_plan())  # type: ignore[attr-defined]
            else:
                it._reset(self)
            return self._iterator
        return self._get_iterator()

    def _make_iterator(self, resume: dict[str, Any] | None) -> Any:
        check_generator(self.generator)
        plan = self._pass_plan()
        engine = self._engine
        # NOTE [ Import only what the loader needs ]: each engine loads when a pass runs on it.
        if plan.executor == "threads":
            from stoker.engine.thread_iter import ThreadIterator

            engine.stats.threads = True
            return ThreadIterator(plan, engine, resume)
        if plan.executor == "calling_thread":
            from stoker.engine.inline_iter import InlineIterator

            inline = InlineIterator(plan, engine, resume)
            if self._dataset_kind:  # an IterableDataset
                inline.restore_iterator_state(resume)
                self._stoker_inline_iter = weakref.ref(inline)
            return inline
        # torch's own check, from a frame at torch's call in its _get_iterator: its warning is
        # attributed, filtered and counted as torch's (NOTE [ torch's voice ]).
        from stoker._core.torch_voice import WORKER_COUNT_AT_ITER, call_as_torch

        call_as_torch(WORKER_COUNT_AT_ITER, self.check_worker_number_rationality)
        from stoker.engine.process_iter import ProcessIterator

        return ProcessIterator(plan, engine, resume)

    def _pass_plan(self) -> Plan:
        """The plan of the pass starting now; the engine's stats learn whether it runs inline."""
        plan = DataLoader.plan(self)  # not self.plan: a subclass may use the name (NOTE above)
        self._engine.fit_workers(plan.num_workers)
        inline = plan.executor == "calling_thread" and self.num_workers > 0
        if inline and not self._engine.inline_told:
            self._engine.inline_told = True
            from stoker.fastpaths.switch import tell_not_per_sample

            tell_not_per_sample(self.dataset, "inline")
        if plan.executor != "threads":
            self._engine.stats.inline = inline
        return plan

    def plan(self) -> Plan:
        """What the next ``iter()`` does, decided from the arguments as they are now, and why
        (NOTE [ One plan ]). ``print(loader.plan())`` lists every decision."""
        from stoker._core.plan import Plan, plan_decisions
        from stoker.engine.base_iter import fetch_spec_of
        from stoker.engine.cursor import keeps_main_rngs

        beyond_now = self._stoker_beyond
        fetch = fetch_spec_of(self.dataset, self.collate_fn, self._auto_collation,
                              self.drop_last, self.on_error, self._stoker_fast_paths,
                              beyond_now, self._stoker_feed_spec)
        seeding = self._stoker_seeding
        executor, executor_why = self._executor(fetch)
        main_rngs = keeps_main_rngs(self.num_workers, self.worker_type, seeding)
        decisions = plan_decisions(
            fetch=fetch, executor=executor, executor_why=executor_why, seeding=seeding,
            seeding_given=self.seeding is not None, num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor, concurrency=self.worker_concurrency,
            main_rngs=main_rngs, feed=self._stoker_feed_spec, pin_memory=self.pin_memory,
            beyond_given=getattr(self, "beyond_torch", None),
        )
        return Plan(
            fetch=fetch, index_sampler=self._index_sampler, sampler=self.sampler,
            batch_sampler=self.batch_sampler, batch_size=self.batch_size,
            generator=self.generator, collate_fn=self.collate_fn, executor=executor,
            worker_type=self.worker_type, num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers,
            in_order=self.in_order, timeout=self.timeout, worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context,
            worker_concurrency=self.worker_concurrency, stall_warning_s=self.stall_warning_s,
            dist=_dist_context() if self.num_workers > 0 else None,
            seeding=seeding, main_rngs=main_rngs,
            pin_memory=self.pin_memory, pin_memory_device=self.pin_memory_device,
            feed=self._stoker_feed_spec, pad_steps=self._stoker_pad_steps,
            skip_budget=self.skip_budget, iterations=self._stoker_iterations,
            len_reported=self._IterableDataset_len_called,
            decisions=decisions,
        )

    @property
    def _stoker_beyond(self) -> frozenset[str]:
        """What this loader does beyond torch, read at each use: NOTE [ Same as torch unless
        asked ] (an argument or the environment changed between epochs counts from the next)."""
        return beyond.resolve(getattr(self, "beyond_torch", None))

    @property
    def _stoker_seeding(self) -> Seeding:
        """``seeding`` as given, else torch's per-worker seeding unless per_batch_seeding is on."""
        if self.seeding is not None:
            return self.seeding
        return "per_batch" if "per_batch_seeding" in self._stoker_beyond else "per_worker"

    def _executor(self, fetch: FetchSpec) -> tuple[Executor, str]:
        """Who loads the pass, and why. inline_gathers (beyond torch), worker_type="auto" with
        workers, for a dataset whose batches are plain gathers: the calling thread (NOTE
        [ Gathers need no workers ]). Decided again at every pass from the loader's current
        arguments (a worker_init_fn or collate_fn set since runs); only the probe of the
        dataset is kept."""
        if self.worker_type == "thread":
            return "threads", (f"worker_type='thread': fetches run on threads of this process "
                               f"(worker_concurrency={self.worker_concurrency!r})")
        if self.num_workers == 0:
            return "calling_thread", "num_workers=0: loaded in the calling thread, as torch does"
        processes: Executor = "processes"
        why = f"num_workers={self.num_workers}: worker processes, as torch starts them"
        if self.worker_type != "auto" or not self.prefetch_factor or (
                "inline_gathers" not in fetch.beyond):
            return processes, why
        from stoker.fastpaths.auto_inline import gathers_suffice
        from stoker.fetch.fetchers import vectorisable

        engine = self._engine
        if self.worker_init_fn is not None or not vectorisable(fetch):
            return processes, why + " (inline_gathers is on, but a worker_init_fn is set or " \
                "the fetch is not a plain gather)"
        if engine.inline is None:
            engine.inline = gathers_suffice(fetch, None, self.batch_size)
        if engine.inline:
            return "calling_thread", ("inline_gathers (beyond torch): every batch is a plain "
                                      "gather of arrays, loaded in the calling thread")
        return processes, why + " (inline_gathers is on; the batches are not plain gathers)"

    # -- answers ---------------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Where the time went so far, and whether the loop is input-bound and why.

        ``print(loader.stats())`` gives the one-line verdict; the fields hold the figures
        (see ``LoaderStats``), including every decision of the concurrency tuner. On an
        input-bound torchvision image pipeline it also names the ``stoker.vision`` import,
        with its gain measured once on this loader's own files (``vision/stats_advice.py``).
        """
        from stoker.vision.stats_advice import with_import_advice

        return with_import_advice(self._engine.stats.snapshot(), self.dataset)

    def add_stats_hook(self, hook: StatsHook) -> None:
        """Tell ``hook`` of every batch this loader hands out from now on (``StatsHook``:
        its ``batch_delivered(samples, at, stats)`` runs in the calling thread). Hooks stay
        with this loader in this process (a pickled copy has none)."""
        from stoker._core.stats import StatsHook

        if not isinstance(hook, StatsHook):
            raise TypeError(
                f"add_stats_hook({hook!r}): expected an object with a "
                "batch_delivered(samples, at, stats) method (stoker.StatsHook).")
        self._engine.add_stats_hook(hook)

    def remove_stats_hook(self, hook: StatsHook) -> None:
        """Stop telling ``hook`` (added with ``add_stats_hook``); nothing if it was not."""
        self._engine.remove_stats_hook(hook)

    def record_timeline(self, max_batches: int | None = None) -> EventRecorder:
        """Record the per-batch timeline (when each step, worker batch and main-process
        stage ran) from now on, keeping the last ``max_batches``; returns the recorder, which
        fills until ``stop_timeline()``. ``stoker doctor`` draws its report from it."""
        from stoker.profile.events import DEFAULT_MAX_BATCHES, EventRecorder

        recorder = EventRecorder(DEFAULT_MAX_BATCHES if max_batches is None else max_batches)
        self._engine.stats.events = recorder
        return recorder

    def stop_timeline(self) -> None:
        """Stop recording the timeline (the recorder keeps what it has)."""
        self._engine.stats.events = None

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state after the last batch this loader handed out (torchdata's semantics).

        Plain values only (ints, strings, lists): it round-trips through ``torch.save`` and JSON.
        Before the first batch it is the initial state; after a finished epoch it is the start
        of the next one. ``load_state_dict`` applies it to the next ``iter()``.
        """
        from stoker.engine.loader_resume import loader_state
        from stoker.engine.rank_state import stamp

        check_generator(self.generator)  # not a torch.Generator: the TypeError iter() raises
        if self._stoker_resume is not None:
            return stamp(self._stoker_resume)  # now this rank's
        ref = self._stoker_inline_iter
        return loader_state(self._resume_facts(), self._engine.progress,
                            ref() if ref is not None else None)

    def _resume_facts(self) -> ResumeFacts:
        """What this loader's state depends on, now (``engine.loader_resume``)."""
        from stoker.engine.loader_resume import ResumeFacts

        it = self._iterator
        return ResumeFacts(
            dataset=self.dataset, kind="iterable" if self._dataset_kind else "map",
            generator=self.generator, index_sampler=self._index_sampler, sampler=self.sampler,
            batch_sampler=self.batch_sampler, batch_size=self.batch_size,
            drop_last=self.drop_last, num_workers=self.num_workers,
            worker_type=self.worker_type, seeding=self._stoker_seeding,
            worker_init_fn=self.worker_init_fn, persistent_workers=self.persistent_workers,
            workers_alive=it is not None and not it.stopped,  # type: ignore[attr-defined]
            iterations=self._stoker_iterations,
            autopilot="epoch_autopilot" in self._stoker_beyond,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` at the next ``iter()``: with the same ``num_workers``, and
        across ``num_workers`` when the state was saved under per-batch seeding.

        Refuses a state that does not fit this loader (NOTE [ A state must fit its loader ]),
        and, before applying any of it, one that is not this rank's."""
        from stoker.engine.loader_resume import checked_state
        from stoker.engine.state_fit import length_or_none

        state = checked_state(state_dict, self._resume_facts(),
                              functools.partial(length_or_none, self))
        self._stoker_iterations = state["iterations"]
        epoch = state.get("sampler_epoch")
        if epoch is not None and callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        self._stoker_resume = state
        self._engine.progress = None
