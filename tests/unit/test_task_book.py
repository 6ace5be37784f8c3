"""The task book of a ProcessIterator's epoch, driven without processes or sockets."""

from __future__ import annotations

from stoker.engine.prefetch_depth import depth_for
from stoker.engine.stragglers import MovePolicy, StragglerWatch
from stoker.engine.task_book import TaskBook


def _send(book: TaskBook, positions: range) -> list[int]:
    """Dispatch like the iterator: each position to the worker the book picks."""
    picked = []
    for position in positions:
        wid = book.pick_worker()
        assert wid is not None
        book.new_task(position, [position * 10])
        book.sent(wid, position)
        picked.append(wid)
    return picked


def test_tasks_go_round_robin_and_come_out_in_sampler_order():
    book = TaskBook(num_workers=2, depth=2, in_order=True, gives_back=[True, True])
    assert book.missing() == 4
    assert _send(book, range(4)) == [0, 1, 0, 1]
    assert book.load == [2, 2] and book.missing() == 0
    assert [list(q) for q in book.queued] == [[0, 2], [1, 3]]
    assert book.answered(1, 1) is True  # worker 1's running task
    book.file(1, 1, "reply 1")
    assert book.next_ready() is None  # position 0 is still being worked on
    assert book.answered(0, 0) is True
    book.file(0, 0, "reply 0")
    assert book.next_ready() == (0, "reply 0")
    assert book.next_ready() == (1, "reply 1")
    assert book.next_ready() is None and book.outstanding()
    assert book.held_by_worker() == {0: [[20]], 1: [[30]]}  # answered ones are not held


def test_completion_order_without_in_order():
    book = TaskBook(num_workers=2, depth=1, in_order=False, gives_back=[True, True])
    _send(book, range(2))
    assert book.pick_worker() is None  # both at their depth
    book.answered(1, 1)
    book.file(1, 1, "second first")
    assert book.next_ready() == (1, "second first")
    assert book.pick_worker() == 1


def test_an_ended_iterable_forgets_what_its_worker_still_held():
    book = TaskBook(num_workers=2, depth=2, in_order=True, gives_back=[False, False])
    _send(book, range(4))
    book.answered(0, 0)
    book.exhausted(0, 0)
    assert book.active == [False, True]
    assert book.held_by_worker() == {1: [[10], [30]]}
    book.answered(1, 1)
    book.file(1, 1, "r1")
    assert book.next_ready() == (1, "r1")  # positions 0 and 2 are skipped, as torch does
    assert book.pick_worker() == 1  # only the active worker gets tasks


def test_a_moved_task_keeps_the_first_copy_only():
    book = TaskBook(num_workers=2, depth=3, in_order=True, gives_back=[True, True])
    for position in range(3):  # all three queued at worker 0; worker 1 idle
        book.new_task(position, [position])
        book.sent(0, position)
    assert book.holds_movable(0) and not book.holds_movable(1)
    position = book.take_queued(0)
    assert position == 1 and list(book.queued[0]) == [0, 2]
    book.moved[position] = {0, 1}
    book.sent(1, position)
    book.answered(1, position)
    assert book.settle_moved(1, position, withdrawn=False) is False  # the first copy
    book.file(1, position, "from worker 1")
    book.answered(0, position)
    assert book.settle_moved(0, position, withdrawn=False) is True  # the second: dropped
    assert position not in book.moved


def test_moves_wait_for_a_straggler():
    book = TaskBook(num_workers=2, depth=3, in_order=True, gives_back=[True, True])
    watch = StragglerWatch(2)
    moves = MovePolicy(book, watch, may_move=True)
    for position in range(3):
        book.new_task(position, [position])
        if book.sent(0, position):
            watch.started(0, 100.0)
    assert moves.queued_elsewhere()
    assert moves.due(idle=[]) is None
    due = moves.due(idle=[1])
    assert due is not None and due > 100.0
    assert moves.victim((None, None), now=100.0) is None  # not slow yet
    assert moves.victim((None, None), now=due) == 0  # no pid to read: the wall time decides
    assert MovePolicy(book, watch, may_move=False).due(idle=[1]) is None


def test_depth_follows_concurrency_and_small_batches():
    assert depth_for(prefetch=2, step_samples=4, concurrency=1, batch_bytes=64 << 20) == 2
    assert depth_for(prefetch=2, step_samples=4, concurrency=16, batch_bytes=64 << 20) == 5
    assert depth_for(prefetch=2, step_samples=4, concurrency=1, batch_bytes=1024) == 8
