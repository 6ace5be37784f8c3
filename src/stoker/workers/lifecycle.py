"""A worker's life between its batches: its start (seeds, ``get_worker_info``,
``worker_init_fn``, a resumed worker's states), each epoch's fetcher (with the concurrency
tuner and the vectorised-fetch probe the first one brings), the answer to a ``Reset``, and
the end of an iterable's stream.

The loop that serves tasks (``workers.main_loop``) holds one ``WorkerState`` and hands it to
these functions: what a batch needs is in the loop's module, what a worker does once per
start or epoch is here (issue 35: a batch's path through a worker stays short).
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker._core.torch_voice import (
    FETCH_WITHOUT_FETCHER_CALL,
    INIT_IN_WORKER_CALL,
    RENEW_FETCHER_IN_WORKER,
    at_torch_call,
    at_torch_rebind,
)
from stoker.fastpaths.index_tensor import VectorProbe
from stoker.fastpaths.torch_datasets import batched_for
from stoker.fetch.concurrency import ConcurrencyTuner, declared_thread_safe
from stoker.fetch.fetchers import make_fetcher, source_form, vectorisable
from stoker.fetch.thread_pool import SamplePipeline
from stoker.sampling.datapipes import seed_shufflers, shard
from stoker.sampling.dataset_rngs import find_dataset_rngs
from stoker.sampling.seeds import global_seeds, reseeded_since, seed_worker_rngs
from stoker.workers import feeder_stand_in
from stoker.workers import protocol as msg
from stoker.workers.batch_builder import BatchBuilder
from stoker.workers.remote_errors import RemoteError, capture
from stoker.workers.stream_states import StreamStates
from stoker.workers.worker_info import set_worker_info


class WorkerState:
    """What the loop and a worker's life between batches share. The loop's own parts (its
    inbox, the tuner decisions it reported) stay on ``Worker``."""

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self.spec = spec
        self.conn = conn
        self.epoch = spec.first_epoch
        self.exhausted = False
        self.stream_batches = 0  # an iterable's batches read from this worker's stream
        self.init_error: RemoteError | None = None  # raised with the first task of the epoch
        self.builder = BatchBuilder(spec, conn)  # the slab pool and the replies
        self.fetcher: Any = None  # None: worker_init_fn or iter(dataset) failed
        self.tuner: ConcurrencyTuner | None = None  # made with the first fetcher
        self.vector: VectorProbe | None = None  # likewise
        self.pipeline: SamplePipeline | None = None  # fetch threads, once concurrency rises
        # NOTE [ Seeds set in worker_init_fn stay ]: False once worker_init_fn seeded them.
        self.seed_per_batch = spec.seed_per_batch
        self.dataset_rngs = find_dataset_rngs(spec.fetch.dataset) if spec.seed_per_batch else []
        self.streams = StreamStates(spec)  # NOTE [ Worker streams resume ]


def start(st: WorkerState) -> None:
    """Seed as torch's worker does, set ``get_worker_info``, run ``worker_init_fn`` once, and
    make the first fetcher; an error is kept for the first task (``init_error``)."""
    spec = st.spec
    seed = seed_worker_rngs(spec.base_seed, spec.worker_id)
    if spec.dist is not None:
        # Spawned workers inherit neither the process group nor torchrun's variables.
        from stoker.distributed.context import set_context

        set_context(spec.dist)
    if spec.datapipe_seed is not None:  # a DataPipe graph: stoker.sampling.datapipes
        seed_shufflers(spec.fetch.dataset, spec.datapipe_seed)
    set_worker_info(spec.worker_id, spec.num_workers, seed, spec.fetch.dataset)
    try:
        if spec.datapipe_ranks is not None:
            shard(spec.fetch.dataset, spec.num_workers, spec.worker_id, *spec.datapipe_ranks)
        if spec.worker_init_fn is not None:
            _run_worker_init_fn(st)
        # NOTE [ Worker streams resume ]: a resumed worker's states, after worker_init_fn
        st.streams.begin(per_worker_streams=not st.seed_per_batch)
        new_fetcher(st)
    except Exception as exc:
        st.init_error = capture(exc, spec.worker_id, "starting (worker_init_fn or iter(dataset))")


# NOTE [ Seeds set in worker_init_fn stay ]
# Under seeding="per_batch" the global RNGs are reseeded before every batch. A
# worker_init_fn that seeds them itself (torch.manual_seed(...), the seed_worker recipe
# from torch's reproducibility notes) asks for torch's per-worker streams instead, and a
# drop-in must not overrule it: this worker then leaves the global RNGs and the dataset's
# generators alone, exactly as under seeding="per_worker", gives no task back (a moved
# batch would draw from another worker's stream), and the main process says so once.


def _run_worker_init_fn(st: WorkerState) -> None:
    assert st.spec.worker_init_fn is not None
    before = global_seeds() if st.seed_per_batch else None
    # from torch's own line (NOTE [ torch's fetchers call the dataset ] in fetch.fetchers)
    at_torch = at_torch_call(*INIT_IN_WORKER_CALL)
    if at_torch is not None:
        at_torch(st.spec.worker_init_fn, st.spec.worker_id)
    else:
        st.spec.worker_init_fn(st.spec.worker_id)
    if before is not None and reseeded_since(before):
        st.seed_per_batch = False
        st.dataset_rngs = []


# NOTE [ After worker_init_fn raised ]
# torch's worker keeps what worker_init_fn (or iter(dataset), or making the fetcher) raised and
# hands it back as the result of its next task, once. It has no fetcher then: every later task
# of that worker raises UnboundLocalError at its fetch line ("cannot access local variable
# 'fetcher'..."), until a persistent worker's next epoch makes a fetcher (worker_init_fn is
# not run again) and loads as usual. A worker that got no task in the epoch keeps the error for
# its first task of the next. The same here: ``init_error`` goes with one task, a later one
# runs a copy of torch's line with ``fetcher`` unbound, and ``reset`` makes a fetcher. (Where
# torch's worker cannot make that fetcher, iter(dataset) raising at a new epoch, it dies;
# stoker's hands the error to the next task.)


def fetch_without_fetcher(indices: Any) -> None:
    """Raise what torch's worker raises for a task when it has no fetcher (NOTE [ After
    worker_init_fn raised ])."""
    at_torch = at_torch_call(*FETCH_WITHOUT_FETCHER_CALL)
    if at_torch is not None:
        at_torch(indices)
    raise UnboundLocalError(
        "cannot access local variable 'fetcher' where it is not associated with a value")


# NOTE [ The old fetcher goes ]
# A persistent worker's new epoch replaces its fetcher, and with it the last epoch's
# ``iter(dataset)``: a generator the loop left early is closed then, and its ``finally`` or
# ``except GeneratorExit`` runs. torch's worker drops it at the line that makes the new fetcher
# (``fetcher = _DatasetKind.create_fetcher(`` in ``_worker_loop``), after ``iter(dataset)`` of
# the new one; what the generator says going (Python's "Exception ignored in" report of a
# generator that ignored GeneratorExit, which quotes that line, a stack it reads) names torch's
# frame. So the old fetcher is handed to a copy of that line (``at_torch_rebind``) and goes
# there, after the new one is made, as under torch.


def new_fetcher(st: WorkerState) -> None:
    """This epoch's fetcher (``iter(dataset)`` for an iterable); the first brings the tuner
    and the vectorised-fetch probe, which last the worker's life."""
    spec = st.spec
    fetcher = make_fetcher(spec.fetch)
    rebind = at_torch_rebind(RENEW_FETCHER_IN_WORKER, "fetcher")
    if st.fetcher is None or rebind is None:
        st.fetcher = fetcher
    else:  # the last epoch's fetcher goes in torch's frame (NOTE [ The old fetcher goes ])
        box = [fetcher, st.fetcher]
        st.fetcher = None
        st.fetcher = rebind(box)
    st.fetcher.sample_context = (spec.base_seed, st.epoch)
    if st.vector is None:
        st.vector = VectorProbe(spec.fetch.dataset, vectorisable(spec.fetch),
                                trusted=spec.vector_trusted, source=source_form(spec.fetch),
                                torch_classes=batched_for(spec.fetch, spec.worker_init_fn))
    if st.tuner is None:
        safe = declared_thread_safe(spec.fetch.dataset)
        st.tuner = ConcurrencyTuner(
            spec.concurrency, safe, can_split=st.fetcher.splittable,
            threads_promised=safe,  # NOTE [ Automatic concurrency ]
        )
    if st.pipeline is not None:
        st.pipeline.set_fetcher(st.fetcher)


def reset(st: WorkerState, message: msg.Reset) -> None:
    """A new epoch on a persistent worker: answer ``Started``, then make its fetcher."""
    st.epoch = message.epoch
    st.builder.free(message.released)
    st.exhausted = False
    st.stream_batches = 0
    _answer_reset(st, message.epoch)
    try:  # even after worker_init_fn raised (NOTE [ After worker_init_fn raised ])
        if message.datapipe_seed is not None:
            seed_shufflers(st.spec.fetch.dataset, message.datapipe_seed)
        # NOTE [ A dataset's epoch on persistent workers ] in engine.process_iter
        if message.dataset_epoch is not None:
            st.spec.fetch.dataset.set_epoch(message.dataset_epoch)
        new_fetcher(st)
    except Exception as exc:
        if st.init_error is None:  # an error not yet handed back goes first
            st.init_error = capture(exc, st.spec.worker_id, "starting an epoch (iter(dataset))")


def _answer_reset(st: WorkerState, epoch: int) -> None:
    """NOTE [ Worker streams resume ]: the states this epoch starts from, before
    ``iter(dataset)``; always sent, so the main process never waits for it in vain."""
    state = None
    if st.init_error is None:
        try:
            state = st.streams.dataset_state()
        except Exception as exc:
            st.init_error = capture(
                exc, st.spec.worker_id, "saving its dataset's state (state_dict())"
            )
    msg.send(st.conn, msg.Started(epoch, st.streams.rngs(), state))
    feeder_stand_in.after_put()  # NOTE [ torch's feeder thread in a worker ]


def send_exhausted(st: WorkerState, task_id: int) -> None:
    """The end of this worker's stream, with the states its next epoch starts from (NOTE
    [ Worker streams resume ]); an error saving them is raised with the next epoch."""
    st.exhausted = True
    try:
        rngs, state = st.streams.at_end()
    except Exception as exc:
        rngs, state = st.streams.rngs(), None
        st.init_error = capture(
            exc, st.spec.worker_id, "saving its dataset's state (state_dict())"
        )
    msg.send(st.conn, msg.Exhausted(st.epoch, task_id, rngs, state))
    feeder_stand_in.after_put()
