"""The main <-> worker messages (``stoker.workers.protocol``): typed at both ends, plain
tuples on the wire (NOTE [ Plain tuples on the wire ])."""

from __future__ import annotations

import os
import pickle
import socket
import struct
from multiprocessing.connection import Connection

import pytest

from stoker.fetch.concurrency import Decision
from stoker.transport.segments import SegmentRef
from stoker.workers import protocol as msg

_REPORT = msg.BatchReport(
    concurrency=2, fetch_wall_s=0.5, fetch_cpu_s=0.25, collate_s=0.125, pack_s=0.0625,
    decisions=(Decision(1.5, 2, "waits on I/O"),), batched="source", queued_s=0.01,
    gives_back=False, init_fn_seeded=True, packed_at=12.5,
)
MESSAGES = [
    msg.Task(epoch=1, task_id=7, indices=[3, 4], released=[0, 2]),
    msg.Reset(epoch=2, released=[1], datapipe_seed=None, dataset_epoch=4),
    msg.Cancel(epoch=1, task_id=7),
    msg.Release(released=[5]),
    msg.Stop(),
    msg.Hello(has_log=True),
    msg.Slab(ref=SegmentRef(segment_id=3, nbytes=4096, name=None)),
    msg.Done(epoch=1, task_id=7, segment_id=3, used=128, payload=b"structure", retired=[1],
             skipped=[9], report=_REPORT, rngs=("raw", b"words", None, b"key", b"g", b"t")),
    msg.Failed(epoch=1, task_id=8, error=ValueError("bad sample")),
    msg.Exhausted(epoch=1, task_id=9, rngs=None, dataset_state=({"i": 3},)),
    msg.Cancelled(epoch=1, task_id=10),
    msg.Started(epoch=2, rngs=("canon", b"state"), dataset_state=None),
]


def test_every_tag_has_one_message_class():
    assert sorted(m.tag for m in MESSAGES) == sorted(msg.Tag)
    assert len({type(m) for m in MESSAGES}) == len(msg.Tag)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_comes_back_as_the_same_typed_message(message):
    wire = msg.encode(message)
    # On the wire: plain values only (no class of ours, so no import on unpickling).
    assert type(wire) is tuple and wire[0] == int(message.tag) and type(wire[0]) is int
    assert b"stoker.workers.protocol" not in pickle.dumps(wire)
    back = msg.decode(pickle.loads(pickle.dumps(wire)))
    assert type(back) is type(message)
    assert back._asdict().keys() == message._asdict().keys()
    for name, value in message._asdict().items():
        if isinstance(value, Exception):
            assert type(back._asdict()[name]) is type(value)
            assert back._asdict()[name].args == value.args
        else:
            assert back._asdict()[name] == value, name


def test_a_done_reply_carries_its_report_typed():
    done = msg.decode(pickle.loads(pickle.dumps(msg.encode(MESSAGES[7]))))
    assert isinstance(done, msg.Done)
    assert type(done.report) is msg.BatchReport
    assert done.report.batched == "source" and done.report.init_fn_seeded is True
    assert done.report.decisions == (Decision(1.5, 2, "waits on I/O"),)


def test_send_and_receive_over_a_socket_pair():
    a, b = socket.socketpair()
    main, worker = Connection(a.detach()), Connection(b.detach())
    try:
        msg.send(main, MESSAGES[0])
        assert worker.poll(10)
        assert msg.recv_from_main(worker) == MESSAGES[0]
        msg.send(worker, MESSAGES[9])
        assert main.poll(10)
        got = msg.recv_from_worker(main)
        assert type(got) is msg.Exhausted and got == MESSAGES[9]
    finally:
        main.close()
        worker.close()


# -- NOTE [ Plain messages skip the reducers ] ---------------------------------------------------

PLAIN = [m for m in MESSAGES if not isinstance(m, (msg.Failed, msg.Slab))] + [
    msg.Done(epoch=1, task_id=7, segment_id=None, used=0, payload=b"p" * 20, retired=[],
             skipped=[], report=_REPORT._replace(decisions=()), rngs=None, fds=2, reused=True),
    msg.Task(epoch=0, task_id=1, indices=list(range(1000, 1256)), released=[]),
    msg.Task(epoch=0, task_id=2, indices={"a": (1, 2.5, None, True), "b": {3, 4}}, released=[]),
]


@pytest.mark.parametrize("message", PLAIN, ids=lambda m: type(m).__name__)
def test_a_plain_message_pickles_to_forkingpicklers_bytes(message):
    from multiprocessing.reduction import ForkingPickler

    wire = msg.encode(message)
    assert msg._dumps(wire) == bytes(ForkingPickler.dumps(wire))


class _Marked:
    """A type only ForkingPickler's own reducers know."""


def test_anything_else_goes_forkingpicklers_way():
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(_Marked, lambda obj: (str, ("reduced by ForkingPickler",)))
    try:
        task = msg.Task(epoch=0, task_id=1, indices=[1, [_Marked()]], released=[])
        back = msg.decode(pickle.loads(msg._dumps(msg.encode(task))))
    finally:
        del ForkingPickler._extra_reducers[_Marked]
    assert back.indices == [1, ["reduced by ForkingPickler"]]


def _pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a.detach()), Connection(b.detach())


@pytest.mark.parametrize("size", [0, 100, 16384, 16385, 60_000])
def test_frames_are_connections_both_ways(size):
    main, worker = _pair()
    try:
        done = PLAIN[-3]._replace(payload=b"x" * size)
        msg.send(worker, done)
        assert main.poll(10)
        assert msg.decode(main.recv()) == done  # Connection reads what send wrote
        task = msg.Task(epoch=0, task_id=3, indices=list(range(size // 4)), released=[])
        main.send(msg.encode(task))  # and send's other end reads Connection's frames
        assert worker.poll(10)
        assert msg.recv_from_main(worker) == task
    finally:
        main.close()
        worker.close()


def test_a_closed_socket_is_eof_and_a_cut_frame_an_oserror():
    main, worker = _pair()
    try:
        main.close()
        with pytest.raises(EOFError):
            msg.recv_from_main(worker)
    finally:
        worker.close()
    main, worker = _pair()
    try:
        main.send_bytes(b"half")  # a frame of 4 bytes...
        os.write(main.fileno(), struct.pack("!i", 10) + b"abc")  # ...then one cut short
        main.close()
        assert worker.recv_bytes() == b"half"
        with pytest.raises(OSError, match="end of file during message"):
            msg.recv_from_main(worker)
    finally:
        worker.close()
