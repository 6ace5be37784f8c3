"""A bounded per-batch timeline of a loader, recorded only when asked for.

Off by default: ``StatsAccumulator.events`` is ``None`` and the loader pays one attribute
test per batch. ``stoker doctor`` (or anyone: ``loader.record_timeline()``) turns it on; it
then keeps the newest ``max_batches`` records of each kind, as plain tuples, so a long run
costs a fixed amount of memory.

Times are ``time.perf_counter()`` seconds. On Linux that is ``CLOCK_MONOTONIC``, one clock for
every process of the machine, so a worker's timestamps line up with the main process's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stoker.workers.protocol import BatchReport

DEFAULT_MAX_BATCHES = 100_000


@dataclass(frozen=True)
class WorkerBatch:
    """One batch as a worker made it: fetch, then collate, then pack (into shared memory)."""

    worker_id: int
    fetch_start: float  # sent - pack - collate - fetch wall (concurrent fetches: approximate)
    collate_start: float
    pack_start: float
    sent: float  # the worker finished packing and replied
    received: float  # the main process read the reply


@dataclass(frozen=True)
class Step:
    """One ``next()`` of the training loop: blocked from ``entered`` to ``left``."""

    entered: float
    left: float
    samples: int


@dataclass(frozen=True)
class MainStage:
    """Work the main process did for a batch: ``unpack`` (receive), ``pin``, ``fetch`` and
    ``collate`` (no workers)."""

    name: str
    start: float
    end: float


class EventRecorder:
    """Appends are plain tuples into bounded deques; records are built when read."""

    def __init__(self, max_batches: int = DEFAULT_MAX_BATCHES) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches={max_batches!r}: expected an int >= 1.")
        self.started = _now()
        self._workers: deque[tuple] = deque(maxlen=max_batches)
        self._steps: deque[tuple] = deque(maxlen=max_batches)
        self._main: deque[tuple] = deque(maxlen=2 * max_batches)

    def worker_batch(self, worker_id: int, report: BatchReport, received: float) -> None:
        self._workers.append((worker_id, report.fetch_wall_s, report.collate_s, report.pack_s,
                              report.packed_at, received))

    def step(self, entered: float, left: float, samples: int) -> None:
        self._steps.append((entered, left, samples))

    def main_stage(self, name: str, start: float, end: float) -> None:
        self._main.append((name, start, end))

    def raw(self) -> dict[str, list]:
        """The records as plain lists (JSON), for ``from_raw`` in another process."""
        return {"started": [self.started], "workers": [list(x) for x in self._workers],
                "steps": [list(x) for x in self._steps], "main": [list(x) for x in self._main]}

    @classmethod
    def from_raw(cls, raw: dict[str, list]) -> EventRecorder:
        rec = cls(max(1, len(raw["workers"]), len(raw["steps"]), len(raw["main"])))
        rec.started = raw["started"][0]
        rec._workers.extend(tuple(x) for x in raw["workers"])
        rec._steps.extend(tuple(x) for x in raw["steps"])
        rec._main.extend(tuple(x) for x in raw["main"])
        return rec

    def worker_batches(self) -> list[WorkerBatch]:
        out = []
        for wid, fetch_wall, collate, pack, sent, received in list(self._workers):
            pack_start = sent - pack
            collate_start = pack_start - collate
            out.append(WorkerBatch(wid, collate_start - fetch_wall, collate_start, pack_start,
                                   sent, received))
        return out

    def steps(self) -> list[Step]:
        return [Step(*s) for s in list(self._steps)]

    def main_stages(self) -> list[MainStage]:
        return [MainStage(*m) for m in list(self._main)]


def _now() -> float:
    import time

    return time.perf_counter()
