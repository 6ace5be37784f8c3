"""The loader's ``state_dict()`` and the checks of ``load_state_dict()``, made from plain facts
about the loader (``ResumeFacts``), never the loader itself (NOTE [ One plan ]).

A state is assembled from the epoch cursor's ``EpochProgress`` (mid-epoch) or
``cursor.fresh_state`` (an epoch not begun), then the keys that must always be there (NOTE
[ Constant state keys ]), the iterator's or dataset's own state, the description the state must
fit (NOTE [ A state must fit its loader ]), each worker's streams (NOTE [ Worker streams
resume ]), and this rank's stamp. Loading checks all of it before anything is applied, but the
dataset's own ``load_state_dict`` (its length may follow its state).
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker.engine.cursor import (
    STATE_FORMAT,
    EpochProgress,
    keeps_main_rngs,
    stateful_sampler_of,
)
from stoker.engine.rank_state import check_rank, stamp
from stoker.engine.state_fit import check_fields, check_fit, describe
from stoker.engine.worker_streams import StreamsOwner, check_worker_streams, state_fields
from stoker.sampling.rng_state import RngSnapshot, check_main_rngs


@dataclass(frozen=True)
class ResumeFacts:
    """What a loader's state depends on, read from the loader when the state is made or
    loaded."""

    dataset: Any
    kind: str  # "map" or "iterable"
    generator: Any
    index_sampler: Any
    sampler: Any
    batch_sampler: Any
    batch_size: int | None
    drop_last: bool
    num_workers: int
    worker_type: str
    seeding: str
    worker_init_fn: Any
    persistent_workers: bool
    workers_alive: bool  # a persistent iterator whose workers go on into the next epoch
    iterations: int  # passes begun
    autopilot: bool  # beyond_torch's epoch_autopilot

    def described(self) -> dict[str, Any]:
        """NOTE [ A state must fit its loader ]: what the state's positions depend on."""
        return describe(self.dataset, self.batch_size, self.drop_last, self.sampler,
                        self.batch_sampler)

    def streams_owner(self) -> StreamsOwner:
        return StreamsOwner(
            dataset=self.dataset, num_workers=self.num_workers, seeding=self.seeding,
            worker_init_fn=self.worker_init_fn, persistent_workers=self.persistent_workers,
            workers_alive=self.workers_alive,
        )


def fresh_state(
    rng: RngSnapshot, finished: EpochProgress | None, persistent_alive: bool, iterations: int,
    sampler_epoch: int | None, kind: str, num_workers: int,
) -> dict[str, Any]:
    """The state of an epoch not begun yet: ``rng`` captured now; ``finished``, the last
    epoch's progress, if any; ``persistent_alive``: its iterator goes on (same base seed)."""
    return {
        "format": STATE_FORMAT,
        "iterations": iterations,
        "epoch": finished.epoch + 1 if persistent_alive and finished is not None else 0,
        "batches": 0,
        "extra_batches": [],
        "finished": False,
        "base_seed": finished.base_seed if persistent_alive and finished is not None else 0,
        "drew_base_seed": not persistent_alive,
        "rng": rng.encoded_unsaved(),
        "sampler_state": None,
        "sampler_epoch": sampler_epoch,
        "sampler_started": False,
        "dataset_kind": kind,
        "num_workers": num_workers,
        "worker_batches": None,  # NOTE [ Constant state keys ]: mid-epoch states have it
    }


def check_state(sd: Any) -> dict[str, Any]:
    """Validate a state dict before it is applied; errors say what is wrong and what to do."""
    if not isinstance(sd, dict):
        raise TypeError(
            f"load_state_dict expects the dict returned by DataLoader.state_dict(), "
            f"got {type(sd).__name__}."
        )
    if sd.get("format") != STATE_FORMAT:
        raise ValueError(
            f"load_state_dict got a state of format {sd.get('format')!r}, expected "
            f"{STATE_FORMAT!r}: pass the dict returned by stoker's DataLoader.state_dict() "
            "(a torchdata StatefulDataLoader state cannot be loaded)."
        )
    return sd


def _constant_sampler_keys(state: dict[str, Any], index_sampler: Any) -> None:
    """NOTE [ Constant state keys ]: checkpointers that match keys (DCP's ``dcp.load``
    descends into nested dicts) need a fresh loader's state to have the keys of a mid-epoch
    one. A stateful sampler's state is recorded only once a batch was delivered, so before that
    it stands in with its current ``state_dict()``, marked as not to be applied: loading it
    resumes exactly as the state without it did."""
    stateful = stateful_sampler_of(index_sampler)
    if state["sampler_state"] is not None or stateful is None:
        state["sampler_state_applies"] = state["sampler_state"] is not None
        return
    state["sampler_state"] = stateful.state_dict()
    state["sampler_state_applies"] = False


def _fresh(facts: ResumeFacts, finished: EpochProgress | None) -> dict[str, Any]:
    """The state of an epoch not begun yet: generators as they are now."""
    from stoker.distributed import next_epoch

    main_rngs = keeps_main_rngs(facts.num_workers, facts.worker_type, facts.seeding)
    rng = RngSnapshot(facts.generator, facts.index_sampler, main_rngs=main_rngs)
    rng.capture()
    persistent_alive = finished is not None and facts.workers_alive
    # The epoch the next pass will run (the autopilot's next step after a finished one).
    sampler_epoch = (
        next_epoch(facts.sampler, facts.batch_sampler, autopilot=facts.autopilot)
        if finished is not None else getattr(facts.sampler, "epoch", None)
    )
    return fresh_state(rng, finished, persistent_alive, facts.iterations, sampler_epoch,
                       facts.kind, facts.num_workers)


def loader_state(facts: ResumeFacts, progress: EpochProgress | None, inline: Any) -> dict[str, Any]:
    """``DataLoader.state_dict()``: the state after the last batch handed out. ``progress``:
    the engine's last epoch begun, if any; ``inline``: the ``num_workers=0`` iterator of an
    IterableDataset, if alive (its iterator's own state is kept, as torchdata keeps it)."""
    if progress is None or progress.finished:
        state = _fresh(facts, progress)
    else:
        state = progress.state_dict()
    _constant_sampler_keys(state, facts.index_sampler)
    iterable = facts.kind == "iterable"
    if iterable and "dataset_iter_state" not in state:
        # Only with num_workers=0: in workers the iterators are the workers' own
        # (docs/from_torchdata.md).
        live = inline is not None and progress is not None and not progress.finished
        state["dataset_iter_state"], state["dataset_iter_ended"] = (
            inline.iterator_state(progress) if live else (None, False))
    state["loader"] = facts.described()  # NOTE [ A state must fit its loader ]
    dataset = facts.dataset
    if callable(getattr(dataset, "state_dict", None)) and not (
        iterable and isinstance(dataset, collections.abc.Iterator)
    ):
        # An IterableDataset that is its own iterator (``__iter__`` returns self): its
        # state_dict() is its iterator's, often unset until ``__iter__`` ran, and at
        # num_workers > 0 this copy never runs it. As in torchdata (dataset_state None for
        # such a dataset), only the iterator state is kept: dataset_iter_state at
        # num_workers=0, the fast-forward in workers.
        state["dataset_state"] = dataset.state_dict()
        # In-process, an iterable's own state is its position; in workers the main
        # process's copy never moves, so the loader must fast-forward instead.
        state["dataset_state_covers_position"] = bool(iterable and facts.num_workers == 0)
    state.update(state_fields(facts.streams_owner(), progress))
    return stamp(state)  # rank, world size, digest: NOTE [ A state must fit its loader ]


def checked_state(
    state_dict: Any, facts: ResumeFacts, steps_now: Callable[[], int | None],
) -> dict[str, Any]:
    """``load_state_dict``'s checks, in order, before the loader applies the state; loads the
    dataset's own state (its length may follow it) before the last check. ``steps_now()``:
    the loader's ``len()``, or None."""
    state = check_state(state_dict)
    check_fields(state)  # NOTE [ A state must fit its loader ]
    state = check_rank(state)  # this rank's own (NOTE [ Every rank's part ]), before applying
    check_worker_streams(state, facts.num_workers)  # NOTE [ Worker streams resume ]
    check_main_rngs(state.get("rng"))  # NOTE [ Main streams resume ]
    dataset = facts.dataset
    if "dataset_state" in state and callable(getattr(dataset, "load_state_dict", None)):
        dataset.load_state_dict(state["dataset_state"])
    check_fit(state, facts.kind, facts.described, steps_now)
    return state
