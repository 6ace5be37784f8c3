"""A worker's side of NOTE [ Worker streams resume ] (``stoker.engine.worker_streams``): the
states that ride back with its replies, and the states a resumed worker starts from.

A map-style batch's reply carries the global RNG states after it: the worker's loop
(``workers.main_loop``) takes them from ``after_batches`` itself, straight from
``sampling.global_rngs``, so that a batch's path does not pass through here."""

from __future__ import annotations

import collections.abc
import pickle
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.sampling import global_rngs, worker_rngs


def keeps_state(dataset: Any) -> bool:
    """An IterableDataset with its own ``state_dict``/``load_state_dict`` that is not its own
    iterator (whose state is its iterator's, as torchdata treats it)."""
    return (
        callable(getattr(dataset, "state_dict", None))
        and callable(getattr(dataset, "load_state_dict", None))
        and not isinstance(dataset, collections.abc.Iterator)
    )


class StreamStates:
    """What one worker reports of its own streams.

    ``rngs()`` is the wire form of the global RNG states, or None when they did not change
    since the last ones sent (``global_rngs.Changes``) or when this worker does not draw from
    per-worker streams (per-batch seeding). ``after_batches``: those same changes, for a
    map-style batch's ``Done``/``Failed``; None when its replies carry no states.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self._spec = spec
        self._map_style = spec.fetch.kind == "map"
        self._stateful = (not self._map_style and spec.persistent
                          and keeps_state(spec.fetch.dataset))
        self._changes: global_rngs.Changes | None = None  # None: not tracked
        self.after_batches: global_rngs.Changes | None = None

    def begin(self, per_worker_streams: bool) -> None:
        """After worker_init_fn: restore a resumed worker's states, then track them."""
        if per_worker_streams:
            self._changes = global_rngs.Changes()
            self.after_batches = self._changes if self._map_style else None
        spec = self._spec
        if not spec.resume:
            return
        rngs, dataset_state = spec.resume[spec.worker_id]
        if dataset_state is not None:  # first: its load_state_dict may draw
            spec.fetch.dataset.load_state_dict(dataset_state[0])
        if rngs is not None:
            worker_rngs.restore(worker_rngs.decode(rngs))

    def rngs(self) -> Any:
        return None if self._changes is None else self._changes.take()

    def dataset_state(self) -> tuple | None:
        """``(pickled dataset.state_dict(),)``: plain pickle, so a tensor in it is copied, not
        handed over as shared memory by the socket's pickler."""
        if not self._stateful:
            return None
        return (pickle.dumps(self._spec.fetch.dataset.state_dict(), pickle.HIGHEST_PROTOCOL),)

    def at_end(self) -> tuple[Any, tuple | None]:
        """An iterable's ``Exhausted``: the states its next epoch starts from (persistent)."""
        if not self._spec.persistent:
            return None, None
        state = self.dataset_state()  # first: the states include what state_dict() drew
        return self.rngs(), state
