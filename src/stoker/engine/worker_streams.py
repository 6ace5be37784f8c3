"""What each worker's own streams need to resume, under torch's per-worker seeding.

NOTE [ Worker streams resume ]
Under ``seeding="per_worker"`` (torch's: each worker seeded once with base_seed + worker_id,
numpy as torch seeds it), or when ``worker_init_fn`` seeds the workers itself (NOTE [ Seeds set
in worker_init_fn stay ]), a batch's random draws depend on everything its worker drew
before. Recomputing the epoch's order and skipping the delivered positions (NOTE [ Resume
state ]) is then not enough: fresh workers would draw the rest of the epoch from the start of
their streams. So:

* Every reply of a map-style batch (``Done``, ``Failed``) carries its worker's global RNG
  states right after the batch (``random``, numpy's, torch's: raw bytes, ~4 us to take, ~10 KB,
  ``sampling.worker_rngs``), or None when they did not change since the worker's last reply
  (a dataset that draws nothing sends nothing). The main process reads a worker's replies in
  the order sent, so None resolves to the last states it got from that worker. The state
  records, per worker, the states after its last *delivered* batch (a worker's batches are
  delivered in the order it made them, in and out of order), and every batch goes to the worker
  that loaded it in the uninterrupted run: position p to worker p mod num_workers, torch's
  round-robin, continued where the saved run stopped (``TaskBook.start_turn_at``). A worker
  that delivered nothing yet this epoch resumes from the states it started the epoch with.
* An IterableDataset cannot seek, so its workers re-read their delivered batches (NOTE
  [ Resume state ]); re-reading draws again, so the state records each worker's states at the
  *start* of the epoch, and the re-read ends exactly where the saved run was. With persistent
  workers that start is the end of the previous epoch (``Exhausted`` carries it), and a dataset
  with ``state_dict``/``load_state_dict`` is saved from the worker's copy too (an epoch counter
  bumped in ``__iter__`` lives there, never in the main process's copy; torchdata collects the
  workers' copies as well), as ``worker_dataset_states``.
* Persistent workers answer every ``Reset`` with ``Started``: their states as the new epoch
  starts. After a finished epoch those are known before it arrives (the previous epoch's last
  replies); after an abandoned one (``break``) the workers first finish the tasks they held, so
  a ``state_dict()`` that needs a worker's start before its ``Started`` arrived waits for it
  (the one case where ``state_dict()`` reads from the workers; torch's own ``iter()`` waits for
  the same thing at every epoch).
* A resumed worker is seeded as always, runs ``worker_init_fn`` (it may configure anything; it
  runs at every start in the uninterrupted run too), then loads its dataset state and restores
  its RNG states, before ``iter(dataset)``.

Per-worker streams only continue with the same ``num_workers``: ``load_state_dict`` refuses
another count once anything was delivered (``check_worker_streams``), naming
``seeding="per_batch"`` / ``beyond_torch=True``, whose states resume at any ``num_workers`` (or
Lightning's ``seed_everything(workers=False)``, or the seeding in ``worker_init_fn``, when those
made the streams per-worker). A state saved with ``num_workers=0`` under torch's seeding carries
the main process's streams instead (NOTE [ Main streams resume ] in ``sampling.rng_state``) and
is refused at another count the same way. Cost per map-style batch under per-worker seeding:
~4 us in the worker, ~2 us more on the socket (both ends) when the states changed, ~0.2 us in
the main process; nothing for an IterableDataset's batches, under per-batch seeding, or for
batches gathered from torch's own classes (they run no code that draws). Generators a
dataset owns (``self.rng``) are not saved: under per-worker seeding every worker has an
identical copy, which stoker warns about.
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import IterableDataset

from stoker.sampling import worker_rngs

UNKNOWN: Any = object()  # a worker's start not reported yet (its Started is on the way)
WORKER_SEEDINGS = ("per_batch", "per_worker", "worker_init_fn", "lightning_worker_init_fn")


@dataclass(frozen=True)
class Start:
    """A worker's states as an epoch starts: None for a fresh worker's (seeded, then
    worker_init_fn, with the main process's copy of the dataset)."""

    rngs: Any = None  # wire or encoded form (``sampling.worker_rngs``)
    # (its dataset's state_dict(),), pickled as a worker sends it (``workers.stream_states``)
    dataset_state: tuple | None = None
    pickled: bool = False


FRESH = Start()


def is_lightning_init_fn(fn: Any) -> bool:
    """Lightning's ``pl_worker_init_function`` (``seed_everything(workers=True)`` installs it,
    as a ``functools.partial`` with the rank)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", "") == "pl_worker_init_function" and str(
        getattr(fn, "__module__", "")).startswith(("lightning", "pytorch_lightning"))


@dataclass
class WorkerStreams:
    """One epoch's view of every worker's streams, kept by a ``ProcessIterator``."""

    kind: str
    starts: list[Any]
    after: list[Any] = field(default_factory=list)  # map-style: states after the last delivered
    ends: list[Any] = field(default_factory=list)  # iterable: states at the end of its stream
    init_fn_seeded: bool = False
    # A weak reference to the iterator's method that reads replies until every start a
    # state needs has arrived.
    await_starts: Any = None
    # worker -> (states, their encoded form): a state_dict() per step encodes only what changed
    _encoded: dict[int, tuple[Any, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.starts)
        self.after = self.after or [None] * n
        self.ends = self.ends or [UNKNOWN] * n

    @classmethod
    def resumed(cls, kind: str, num_workers: int, resume: dict[str, Any] | None,
                ) -> WorkerStreams:
        """The first epoch of an iterator: fresh workers, or those a state restores."""
        return cls(kind, [Start(*entry) for entry in resume_entries(resume, num_workers)]
                   if resume else [FRESH] * num_workers)

    def next_epoch(self, finished: bool) -> WorkerStreams:
        """The next epoch on the same (persistent) workers."""
        starts = self.next_starts() if finished else [UNKNOWN] * len(self.starts)
        return WorkerStreams(self.kind, starts, init_fn_seeded=self.init_fn_seeded,
                             await_starts=self.await_starts)

    # -- what the workers report -------------------------------------------------------------

    def ended(self, worker: int, rngs: Any, dataset_state: tuple | None) -> None:
        self.ends[worker] = Start(rngs, dataset_state, pickled=True)

    def started(self, worker: int, rngs: Any, dataset_state: tuple | None) -> None:
        self.starts[worker] = Start(rngs, dataset_state, pickled=True)

    # -- what a state needs ------------------------------------------------------------------

    def next_starts(self) -> list[Any]:
        """After a finished epoch: where each worker stands for the next one."""
        if self.kind == "map":
            return [s if a is None else Start(a) for s, a in zip(self.starts, self.after,
                                                                 strict=True)]
        return list(self.ends)

    def missing(self, finished: bool) -> bool:
        """Whether a state needs a worker start that has not arrived yet."""
        if finished:
            return any(s is UNKNOWN for s in self.next_starts())
        if self.kind == "map":
            return any(s is UNKNOWN and a is None
                       for s, a in zip(self.starts, self.after, strict=True))
        return any(s is UNKNOWN for s in self.starts)

    def encoded(self, worker: int, rngs: Any) -> str:
        """``worker_rngs.encode(rngs)``, remembered (~12 us per worker otherwise)."""
        memo = self._encoded.get(worker)
        if memo is None or memo[0] is not rngs:
            memo = self._encoded[worker] = (rngs, worker_rngs.encode(rngs))
        return memo[1]

    def entries(self, finished: bool) -> list[Start]:
        """Per worker, what the state records (after ``missing`` is False)."""
        if finished:
            return [FRESH if s is UNKNOWN else s for s in self.next_starts()]
        if self.kind == "map":
            return [FRESH if s is UNKNOWN and a is None else Start(a) if a is not None else s
                    for s, a in zip(self.starts, self.after, strict=True)]
        return [FRESH if s is UNKNOWN else s for s in self.starts]


# -- the state's fields ----------------------------------------------------------------------


def tracks_dataset(dataset: Any, num_workers: int, persistent_workers: bool) -> bool:
    """Whether the workers' dataset copies are saved: persistent workers reading an
    IterableDataset that has ``state_dict``/``load_state_dict``."""
    from stoker.workers.stream_states import keeps_state

    return bool(isinstance(dataset, IterableDataset) and num_workers > 0 and persistent_workers
                and keeps_state(dataset))


def worker_seeding(seeding: str, worker_init_fn: Any, streams: WorkerStreams | None) -> str:
    if seeding != "per_batch":
        return "per_worker"
    if streams is not None and streams.init_fn_seeded:
        lightning = is_lightning_init_fn(worker_init_fn)
        return "lightning_worker_init_fn" if lightning else "worker_init_fn"
    return "per_batch"


@dataclass(frozen=True)
class StreamsOwner:
    """What the state's worker fields depend on, as the loader is now: its dataset, worker
    count, seeding, ``worker_init_fn``, whether its workers persist, and whether a persistent
    iterator's workers are alive (they carry their streams into the next epoch)."""

    dataset: Any
    num_workers: int
    seeding: str
    worker_init_fn: Any
    persistent_workers: bool
    workers_alive: bool


def state_fields(owner: StreamsOwner, progress: Any) -> dict[str, Any]:
    """``worker_seeding``, ``worker_rngs`` and ``worker_dataset_states`` for ``state_dict()``.

    The lists always have one entry per worker when they apply (NOTE [ Constant state keys ]):
    ``None`` in ``worker_rngs`` and the main process's dataset state in
    ``worker_dataset_states`` stand for a worker that starts fresh.
    """
    streams = getattr(progress, "streams", None) if progress is not None else None
    finished = progress is None or progress.finished
    if finished and not (owner.persistent_workers and owner.workers_alive):
        streams = None  # the next epoch starts fresh workers
    n = owner.num_workers
    entries = [FRESH] * n
    if streams is not None:
        await_starts = streams.await_starts() if streams.await_starts is not None else None
        if await_starts is not None and streams.missing(finished):
            await_starts()
        entries = streams.entries(finished)
    rngs = [None if e.rngs is None or streams is None else streams.encoded(w, e.rngs)
            for w, e in enumerate(entries)]
    fields: dict[str, Any] = {
        "worker_seeding": worker_seeding(owner.seeding, owner.worker_init_fn, streams),
        "worker_rngs": rngs if any(r is not None for r in rngs) else None,
        "worker_dataset_states": None,
    }
    if tracks_dataset(owner.dataset, n, owner.persistent_workers):
        main = owner.dataset.state_dict()
        fields["worker_dataset_states"] = [
            main if e.dataset_state is None else
            pickle.loads(e.dataset_state[0]) if e.pickled else e.dataset_state[0]
            for e in entries]
    return fields


def resume_entries(resume: dict[str, Any] | None, num_workers: int
                   ) -> list[tuple[Any, tuple | None]]:
    """Per worker: (encoded RNG states or None, (dataset state,) or None) to start from."""
    rngs = (resume or {}).get("worker_rngs")
    states = (resume or {}).get("worker_dataset_states")
    if not isinstance(rngs, list) or len(rngs) != num_workers:
        rngs = [None] * num_workers
    if not isinstance(states, list) or len(states) != num_workers:
        return [(r, None) for r in rngs]
    return [(r, (s,)) for r, s in zip(rngs, states, strict=True)]


# -- loading a state -------------------------------------------------------------------------

_UNCHANGED = "Pass the dict returned by DataLoader.state_dict() unchanged."


def _check_types(state: dict[str, Any]) -> None:
    seeding = state.get("worker_seeding", "per_batch")
    if seeding not in WORKER_SEEDINGS:
        raise ValueError(
            f"load_state_dict: state['worker_seeding'] is {seeding!r}, expected one of "
            f"{WORKER_SEEDINGS}. {_UNCHANGED}")
    rngs = state.get("worker_rngs")
    if rngs is not None and not (isinstance(rngs, list) and len(rngs) == state.get(
            "num_workers", len(rngs))):
        raise ValueError(
            f"load_state_dict: state['worker_rngs'] is {type(rngs).__name__}, expected None or "
            f"a list of one RNG state (or None) per worker. {_UNCHANGED}")
    for k, text in enumerate(rngs or ()):
        if text is not None:  # None: a worker that starts fresh
            worker_rngs.check_saved(text, f"state['worker_rngs'][{k}]", "a worker's RNG state")
    states = state.get("worker_dataset_states")
    if states is not None and not isinstance(states, list):
        raise ValueError(
            f"load_state_dict: state['worker_dataset_states'] is {type(states).__name__}, "
            f"expected None or a list of one dataset state per worker. {_UNCHANGED}")


def _why(seeding: str) -> tuple[str, str]:
    """What made the workers' streams their own, and how to seed by position instead."""
    if seeding == "per_worker":
        return (
            " under torch's per-worker seeding (seeding=\"per_worker\"): each worker draws its "
            "random numbers from its own streams, seeded once with base_seed + worker_id,",
            "save it from a loader built with seeding=\"per_batch\" (or beyond_torch=True), "
            "which seeds every batch from its position: its states resume at any num_workers.")
    if seeding == "lightning_worker_init_fn":
        cause = (", and Lightning's seed_everything(workers=True) gave the loader a "
                 "worker_init_fn (pl_worker_init_function) that seeds the global RNGs in each "
                 "worker: each worker draws its random numbers from its own streams,")
        fix = "call seed_everything(seed, workers=False)"
    else:
        cause = (", and its worker_init_fn seeded the global RNGs in each worker (NOTE [ Seeds "
                 "set in worker_init_fn stay ]): each worker draws its random numbers from its "
                 "own streams,")
        fix = "drop the seeding from worker_init_fn"
    return cause, (f"{fix}: seeding=\"per_batch\" then seeds every batch from its position, "
                   "and its states resume at any num_workers.")


def check_worker_streams(state: dict[str, Any], num_workers: int) -> None:
    """Refuse a state whose workers' own streams cannot continue with ``num_workers`` (another
    count than the state's), naming the switch that makes states resume anywhere (NOTE
    [ Worker streams resume ])."""
    _check_types(state)
    seeding = state.get("worker_seeding", "per_batch")
    saved, now = state.get("num_workers", 0), num_workers
    if seeding == "per_batch" or saved == now:
        return
    rngs = state.get("worker_rngs") or ()
    if not (state.get("batches", 0) or state.get("extra_batches") or any(
            r is not None for r in rngs)):
        return  # nothing drawn yet that the rest of the epoch continues
    cause, fix = _why(seeding)
    follows = "depends on which worker loads which batch"
    if saved == 0:  # NOTE [ Main streams resume ]
        cause = (" under torch's per-worker seeding (seeding=\"per_worker\"): its samples drew "
                 "their random numbers from the main process's global RNGs (num_workers=0),")
        follows = "continues those streams"
    raise ValueError(
        f"load_state_dict: this state was saved with num_workers={saved}{cause} so the rest of "
        f"the epoch {follows} and cannot be drawn by num_workers={now}. Load it into a loader "
        f"with num_workers={saved}, or {fix}"
    )
