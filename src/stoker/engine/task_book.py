"""Which task is where: dispatched, queued at which worker, moved, answered, ready to yield.

The book of one epoch of a ``ProcessIterator``: plain bookkeeping, no sockets, no processes
(``tests/unit/test_task_book.py`` drives it directly). A task is a batch position in the
epoch's sampler order (NOTE [ Resume state ]); each worker runs its tasks in the order sent,
the first of its queue running (NOTE [ Idle workers take queued tasks ] in
``workers.main_loop``).
"""

from __future__ import annotations

from collections import deque
from typing import Any


class TaskBook:
    """Tasks of one epoch by position; per worker its load, depth, queue and state."""

    def __init__(self, num_workers: int, depth: int, in_order: bool,
                 gives_back: list[bool]) -> None:
        n = num_workers
        self.num_workers = n
        self.in_order = in_order
        self.order: deque[int] = deque()  # dispatched positions, in sampler order
        self.worker_of: dict[int, int] = {}  # outstanding task -> worker
        self.indices: dict[int, Any] = {}  # what the sampler gave, until delivered
        self.ready: dict[int, tuple[int, Any]] = {}  # replies not yet yielded: (wid, reply)
        self.arrivals: deque[int] = deque()  # completion order, for in_order=False
        self.load = [0] * n  # unanswered tasks per worker
        self.active = [True] * n  # False once its iterable ended
        # Each worker's unanswered tasks in the order sent (the first is running), and moved
        # tasks -> the workers that still owe a reply.
        self.queued: list[deque[int]] = [deque() for _ in range(n)]
        self.moved: dict[int, set[int]] = {}
        # Tasks a worker may hold: prefetch_factor, or more (NOTE [ Deeper prefetch for small
        # batches ] in ``engine.prefetch_depth``).
        self.depth = [depth] * n
        # Whether each worker's last reply said it can give a queued task back; carried from
        # one epoch to the next by the iterator.
        self.gives_back = gives_back
        self.sampler_done = False
        self._turn = 0  # torch's round-robin cycle: the worker asked next

    # -- sending -----------------------------------------------------------------------------

    def missing(self) -> int:
        """Tasks the workers could take before each holds its depth."""
        return sum(max(0, d - n) for d, n in zip(self.depth, self.load, strict=True))

    def pick_worker(self) -> int | None:
        """torch's cycle: the next active worker (with in_order=False, one below its depth)."""
        for _ in range(self.num_workers):
            wid = self._turn
            self._turn = (wid + 1) % self.num_workers
            if self.active[wid] and (self.in_order or self.load[wid] < self.depth[wid]):
                return wid
        return None

    def take_turn(self, wid: int) -> bool:
        """Whether the cycle is at worker ``wid`` (then it moves on): a task sent to ``wid``
        outside ``pick_worker`` (NOTE [ Tasks before the next fork ]) takes its turn."""
        if self._turn != wid:
            return False
        self._turn = (wid + 1) % self.num_workers
        return True

    def start_turn_at(self, wid: int) -> None:
        """A resumed epoch continues the cycle where the saved run stopped, so each remaining
        batch goes to the worker that loaded it there (NOTE [ Worker streams resume ])."""
        self._turn = wid % self.num_workers

    def new_task(self, position: int, index: Any) -> None:
        self.order.append(position)
        self.indices[position] = index

    def sent(self, wid: int, position: int) -> bool:
        """Task ``position`` went to worker ``wid``; True if that worker was idle (it starts)."""
        self.worker_of[position] = wid
        self.queued[wid].append(position)
        was_idle = self.load[wid] == 0
        self.load[wid] += 1
        return was_idle

    # -- answers -----------------------------------------------------------------------------

    def answered(self, wid: int, position: int) -> bool:
        """Worker ``wid`` answered task ``position``; True if it was the one running."""
        self.load[wid] -= 1
        queued = self.queued[wid]
        if queued and queued[0] == position:
            queued.popleft()
            return True
        if position in queued:
            queued.remove(position)
        return False

    def settle_moved(self, wid: int, position: int, withdrawn: bool) -> bool:
        """A reply for a moved task: True if it is not the batch (a withdrawal, or the copy
        that came second)."""
        owing = self.moved[position]
        owing.discard(wid)
        if not owing:
            del self.moved[position]
        return withdrawn or position not in self.worker_of

    def exhausted(self, wid: int, position: int) -> None:
        """Worker ``wid``'s iterable ended: the tasks it still holds yield nothing either
        (torch skips them too). Unless forgotten, in_order=False would wait for them."""
        self.active[wid] = False
        for spent in (position, *self.queued[wid]):
            self.worker_of.pop(spent, None)
            self.indices.pop(spent, None)

    def file(self, wid: int, position: int, reply: Any) -> None:
        """A reply to deliver: it waits in ``ready`` until its turn."""
        self.worker_of.pop(position, None)
        self.ready[position] = (wid, reply)
        if not self.in_order:
            self.arrivals.append(position)

    def next_ready(self) -> tuple[int, Any] | None:
        """The next (wid, reply) to yield, or None while it is still being worked on."""
        if not self.in_order:
            return self.ready.pop(self.arrivals.popleft()) if self.arrivals else None
        while self.order:
            position = self.order[0]
            if position in self.ready:
                self.order.popleft()
                return self.ready.pop(position)
            wid = self.worker_of.get(position)
            if wid is not None and self.active[wid]:
                return None  # still being worked on
            self.order.popleft()  # its worker's iterable ended: skip, as torch does
            self.worker_of.pop(position, None)
            self.indices.pop(position, None)
        return None

    def awaited_worker(self) -> int | None:
        """The worker whose reply is yielded next (in order), or None."""
        return self.worker_of.get(self.order[0]) if self.in_order and self.order else None

    def awaited_ready(self) -> bool:
        """Whether ``next_ready`` has a reply to give now (or may skip to one)."""
        if not self.in_order:
            return bool(self.arrivals)
        if not self.order:
            return False
        position = self.order[0]
        wid = self.worker_of.get(position)
        return position in self.ready or wid is None or not self.active[wid]

    def outstanding(self) -> bool:
        return bool(self.worker_of)

    def held_by_worker(self) -> dict[int, list[Any]]:
        """Worker -> the sampler's indices of the tasks it has not answered, by position."""
        held: dict[int, list[Any]] = {}
        for position, index in sorted(self.indices.items()):
            wid = self.worker_of.get(position)
            if wid is not None:
                held.setdefault(wid, []).append(index)
        return held

    # -- moving queued tasks (NOTE [ Idle workers take queued tasks ]) -------------------------

    def holds_movable(self, wid: int) -> bool:
        """Does worker ``wid`` hold a task it has not started and could give back?"""
        return self.gives_back[wid] and len(self.queued[wid]) > 1

    def take_queued(self, victim: int) -> int:
        """Take the first task not started from ``victim``'s queue ([0] runs)."""
        position = self.queued[victim][1]
        del self.queued[victim][1]
        return position
