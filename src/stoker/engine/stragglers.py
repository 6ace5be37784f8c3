"""Tell a worker stuck on a straggler batch from one that is merely slow or paused.

NOTE [ Only stragglers move ]
A task queued behind a slow batch may move to an idle worker (NOTE [ Idle workers take
queued tasks ] in ``workers.main_loop``). A moved batch is loaded by another worker than
torch's (a dataset that looks at ``get_worker_info().id`` sees it; torch's own
test_ind_worker_queue does), and a CANCEL that comes late loads it twice. So a task moves only
from behind a straggler: the batch running before it has taken _MOVE_AFTER_BATCHES times the
usual batch time and at least _MOVE_AFTER_S, and its worker is computing, not waiting for a
CPU: over a window of _CPU_WINDOW_S its main thread ran at least _BUSY_SHARE of the time. On a
loaded machine a worker the scheduler left out for 50 ms keeps its tasks. A batch that waits
on I/O instead (its worker uses no CPU) counts after _WAITING_STRAGGLER_S. The CPU time is read
from /proc only while a move is being considered, never per batch.
"""

from __future__ import annotations

from stoker.engine.task_book import TaskBook

_MOVE_AFTER_S = 0.05
_MOVE_AFTER_BATCHES = 4.0
_CPU_WINDOW_S = 0.02
_BUSY_SHARE = 0.5
_WAITING_STRAGGLER_S = 1.0


def thread_cpu_s(pid: int) -> float | None:
    """CPU time of process ``pid``'s main thread (``None`` where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class StragglerWatch:
    """Per worker: when its running batch started, and CPU samples while it looks slow."""

    def __init__(self, num_workers: int) -> None:
        self._since = [0.0] * num_workers
        self._sample: list[tuple[float, float] | None] = [None] * num_workers
        self.batch_s: float | None = None  # recent time a worker takes for one batch

    def started(self, wid: int, now: float) -> None:
        self._since[wid] = now
        self._sample[wid] = None

    def finished(self, wid: int, now: float) -> None:
        """Worker ``wid`` answered the batch it was running; the next one starts now."""
        took = now - self._since[wid]
        self.batch_s = took if self.batch_s is None else 0.8 * self.batch_s + 0.2 * took
        self.started(wid, now)

    def due(self, wid: int) -> float:
        """The earliest time worker ``wid``'s running batch may count as a straggler."""
        usual = self.batch_s if self.batch_s is not None else 0.0
        at = self._since[wid] + max(_MOVE_AFTER_S, _MOVE_AFTER_BATCHES * usual)
        sample = self._sample[wid]
        return at if sample is None else max(at, sample[0] + _CPU_WINDOW_S)

    def straggling(self, wid: int, pid: int | None, now: float) -> bool:
        if now < self.due(wid):
            return False
        if now - self._since[wid] >= _WAITING_STRAGGLER_S:
            return True
        cpu = thread_cpu_s(pid) if pid is not None else None
        if cpu is None:
            return True  # no /proc: the wall time alone decides
        sample, self._sample[wid] = self._sample[wid], (now, cpu)
        return sample is not None and cpu - sample[1] >= _BUSY_SHARE * (now - sample[0])


class MovePolicy:
    """Which queued task may move to which idle worker, and when (NOTE [ Only stragglers
    move ]); it decides, the iterator sends. Reads the epoch's ``TaskBook``."""

    def __init__(self, book: TaskBook, watch: StragglerWatch, may_move: bool) -> None:
        self.book = book
        self.watch = watch
        self.may_move = may_move

    def queued_elsewhere(self) -> bool:
        """Does some worker hold a task it could give back?"""
        book = self.book
        return self.may_move and any(map(book.holds_movable, range(book.num_workers)))

    def due(self, idle: list[int]) -> float | None:
        """The earliest time a queued task may move to an idle worker; None if none can."""
        if not idle or not self.queued_elsewhere():
            return None
        book = self.book
        return min(self.watch.due(w) for w in range(book.num_workers) if book.holds_movable(w))

    def victim(self, pids: tuple[int | None, ...], now: float) -> int | None:
        """The straggling worker with the longest queue to take a task from; None if none."""
        book = self.book
        victims = [w for w in range(book.num_workers) if book.holds_movable(w)
                   and self.watch.straggling(w, pids[w], now)]
        return max(victims, key=lambda w: len(book.queued[w])) if victims else None
