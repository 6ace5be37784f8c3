"""The message protocol between the main process and a worker (one duplex socket each).

Every message is a ``NamedTuple`` defined here, imported by both sides; its class is its kind
(``tag`` names it as a ``Tag``), and its fields are read by name, never by position. Messages
go through ``send`` and ``recv`` (NOTE [ Plain tuples on the wire ]).

main -> worker: ``Task``, ``Reset``, ``Cancel``, ``Release``, ``Stop``.
worker -> main: ``Hello``, ``Slab``, ``Done``, ``Failed``, ``Exhausted``, ``Cancelled``,
``Started`` (the answer to a ``Reset``).

Each ``Task`` gets exactly one reply: ``Done``, ``Failed``, ``Exhausted`` or ``Cancelled``. A
``Cancel`` for a task already started or answered gets none (the task's own reply follows or
went before). Every reply carries its epoch so that replies to an abandoned epoch (``break``
with persistent workers) are recognised and their slabs recycled instead of being delivered.
"""

from __future__ import annotations

import array
import contextlib
import enum
import errno
import io
import os
import pickle
import socket
import struct
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, NamedTuple

from stoker.transport import torch_way

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from multiprocessing.connection import Connection

    from stoker.fetch.concurrency import Decision
    from stoker.transport.reused_shm import MainSegments


class Tag(enum.IntEnum):
    """The kind of a message (``message.tag``); its class says the same."""

    TASK = 0
    """main -> worker: fetch and collate one batch."""
    RESET = 1
    """main -> worker: a new epoch for persistent workers; restart the iterable dataset."""
    STOP = 2
    """main -> worker: exit now."""
    CANCEL = 3
    """main -> worker: give this task back if it has not started."""
    RELEASE = 4
    """main -> worker: slabs given back on their own, without a task."""
    SLAB = 10
    """worker -> main: a new slab; its fd follows."""
    DONE = 11
    """worker -> main: a batch is packed in a slab."""
    FAILED = 12
    """worker -> main: a batch failed; the error travels."""
    EXHAUSTED = 13
    """worker -> main: the iterable dataset ended in this worker."""
    HELLO = 14
    """worker -> main: the first message of a worker."""
    CANCELLED = 15
    """worker -> main: answers a ``Cancel``: the task was not started and never will be."""
    STARTED = 16
    """worker -> main: answers a ``Reset``: the worker's states at the start of the epoch."""


# -- main -> worker ----------------------------------------------------------------------------


class Task(NamedTuple):
    """Fetch and collate one batch."""

    epoch: int
    task_id: int
    """The batch's position in the epoch's sampler order (NOTE [ Resume state ])."""
    indices: Any
    """What the sampler gave: a list of indices, one index, or None for an iterable."""
    released: list[int]
    """Slab ids of this worker the main process no longer uses."""

    @property
    def tag(self) -> Tag:
        return Tag.TASK


class Reset(NamedTuple):
    """A new epoch for persistent workers: restart the iterable dataset, forget the old epoch."""

    epoch: int
    released: list[int]
    """Slab ids of this worker the main process no longer uses."""
    datapipe_seed: int | None
    """The epoch's shared seed for an IterDataPipe's shufflers (``sampling.datapipes``)."""
    dataset_epoch: int | None = None
    """The main process's dataset's ``stoker_epoch()``, for the worker's copy's ``set_epoch``
    (NOTE [ A dataset's epoch on persistent workers ] in ``engine.process_iter``)."""

    @property
    def tag(self) -> Tag:
        return Tag.RESET


class Cancel(NamedTuple):
    """Give this task back if it has not started (NOTE [ Idle workers take queued tasks ])."""

    epoch: int
    task_id: int

    @property
    def tag(self) -> Tag:
        return Tag.CANCEL


class Release(NamedTuple):
    """Slabs the main process no longer uses, sent without a task when they are large and it
    waits for a batch (NOTE [ Slabs come back before the next task ])."""

    released: list[int]
    epoch_ended: bool = False
    """The epoch ended (persistent workers): drop the free reused segments too, so the memory
    held between epochs is torch's (NOTE [ torch's shared memory, reused ])."""

    @property
    def tag(self) -> Tag:
        return Tag.RELEASE


class Stop(NamedTuple):
    """Exit now."""

    @property
    def tag(self) -> Tag:
        return Tag.STOP


# -- worker -> main ----------------------------------------------------------------------------


class Hello(NamedTuple):
    """A worker's first message."""

    has_log: bool
    """When true, two fds follow: the worker's stack log and the write end of the pipe its
    stacks are asked for through (``workers.diagnostics``)."""

    crash_stacks: bool = False
    """Whether a crash writes the worker's stacks to that log (faulthandler was on)."""

    @property
    def tag(self) -> Tag:
        return Tag.HELLO


class Slab(NamedTuple):
    """A new slab of this worker; with a memfd its fd follows at once (SCM_RIGHTS)."""

    ref: Any
    """Its ``transport.segments.SegmentRef``."""

    @property
    def tag(self) -> Tag:
        return Tag.SLAB


class BatchReport(NamedTuple):
    """How a worker made one batch: figures for ``loader.stats()`` and for dispatch."""

    concurrency: int
    """The worker's fetch concurrency now (NOTE [ Automatic concurrency ])."""
    fetch_wall_s: float
    fetch_cpu_s: float
    collate_s: float
    pack_s: float
    decisions: tuple[Decision, ...]
    """The tuner's decisions since the last report (usually none)."""
    batched: str
    """Which batched form fetched it whole ("source" or "call"), "" for none."""
    queued_s: float
    """Seconds spent waiting for a CPU since the last report."""
    gives_back: bool
    """Whether this worker can give a queued task back (NOTE [ Idle workers take queued
    tasks ]): it fetches one batch at a time and seeds per batch."""
    init_fn_seeded: bool
    """``worker_init_fn`` seeded the global RNGs (NOTE [ Seeds set in worker_init_fn stay ])."""
    packed_at: float
    """When the worker finished packing (``time.perf_counter``: one clock for all processes on
    Linux); the per-batch timeline of ``profile.events``."""
    nbytes: int = 0
    """The batch's tensor and array bytes, in a slab or in torch's shared memory."""


class Done(NamedTuple):
    """A batch is packed (in a slab, or torch's way: ``workers.batch_builder``); the worker
    asks for more tasks in flight when its concurrency outgrows prefetch_factor
    (``report.concurrency``)."""

    epoch: int
    task_id: int
    segment_id: int | None
    """The slab it is in; None for a batch with no tensors or without ``slab_transport`` (it
    travels in ``payload``)."""
    used: int
    """Bytes of the slab the batch uses."""
    payload: bytes | torch_way.Unpickled
    """The batch's structure (``transport.slab_writer``), or the batch torch's way (pickled;
    unpickled once its fds are received: ``recv_from_worker``)."""
    retired: list[int]
    """Slab ids this worker closed: the main process unmaps them."""
    skipped: list[Any]
    """Samples left out under ``on_error="skip"``."""
    report: BatchReport
    rngs: Any = None
    """The worker's global RNG states after this batch (``sampling.worker_rngs``' wire form),
    or None: unchanged since the last it sent, or not tracked (NOTE [ Worker streams
    resume ] in ``engine.worker_streams``)."""
    fds: int = 0
    """Shared-memory fds sent right after this message (NOTE [ Batches cross as torch's do ]
    in ``transport.torch_way``); ``recv_from_worker`` receives them and unpickles the batch."""
    reused: bool = False
    """The batch is pickled torch's way with storages in segments the main process already
    has (NOTE [ torch's shared memory, reused ] in ``transport.reused_shm``): unpickled at
    arrival too, even with no fds behind it."""

    @property
    def tag(self) -> Tag:
        return Tag.DONE


class Failed(NamedTuple):
    """A batch (or the worker's start) failed."""

    epoch: int
    task_id: int
    error: Any
    """A ``workers.remote_errors.RemoteError``: the exception object, its traceback, notes."""
    rngs: Any = None
    """As ``Done.rngs``: the states after the failed batch."""

    @property
    def tag(self) -> Tag:
        return Tag.FAILED


class Exhausted(NamedTuple):
    """The iterable dataset ended in this worker; its later tasks are ignored."""

    epoch: int
    task_id: int
    rngs: Any = None
    """As ``Done.rngs``: the states at the end of the worker's stream (persistent workers)."""
    dataset_state: tuple | None = None
    """``(dataset.state_dict(),)`` of the worker's copy at the end of its stream, or None
    (NOTE [ Worker streams resume ])."""

    @property
    def tag(self) -> Tag:
        return Tag.EXHAUSTED


class Cancelled(NamedTuple):
    """Answers a ``Cancel``: the task was not started and never will be."""

    epoch: int
    task_id: int

    @property
    def tag(self) -> Tag:
        return Tag.CANCELLED


class Started(NamedTuple):
    """Answers a ``Reset``: the worker's states as the epoch starts, before ``iter(dataset)``
    (NOTE [ Worker streams resume ] in ``engine.worker_streams``)."""

    epoch: int
    rngs: Any
    """As ``Done.rngs``."""
    dataset_state: tuple | None
    """As ``Exhausted.dataset_state``."""

    @property
    def tag(self) -> Tag:
        return Tag.STARTED


# NOTE [ Plain tuples on the wire ]
# A named tuple pickles as a reference to its class, which pickle resolves by importing the
# module on both ends: ~2.5 us more to dump and ~2 us more to load per named tuple, measured,
# where a DONE as a plain tuple takes 0.5 us each way (one DONE per batch, on the main
# process's side of the hot path). So on the socket a message is a plain tuple, its tag's int
# value first, then its fields in order (the report of a ``Done`` as a plain tuple too), and
# ``send``/``recv`` convert at the two ends; nothing else sees the positional form.

_CLASSES: dict[int, type] = {
    Tag.TASK: Task, Tag.RESET: Reset, Tag.STOP: Stop, Tag.CANCEL: Cancel, Tag.RELEASE: Release,
    Tag.SLAB: Slab, Tag.DONE: Done, Tag.FAILED: Failed, Tag.EXHAUSTED: Exhausted,
    Tag.HELLO: Hello, Tag.CANCELLED: Cancelled, Tag.STARTED: Started,
}
_TAGS: dict[type, int] = {cls: int(tag) for tag, cls in _CLASSES.items()}
_CLASSES = {int(tag): cls for tag, cls in _CLASSES.items()}


_REPORT_AT = Done._fields.index("report")  # the report's place in a DONE (wire: + 1)


def encode(message: Message) -> tuple:
    """The wire form of ``message`` (NOTE [ Plain tuples on the wire ])."""
    if type(message) is Done:
        at = _REPORT_AT
        return (Tag.DONE.value, *message[:at], tuple(message.report), *message[at + 1:])
    return (_TAGS[type(message)], *message)


def decode(wire: tuple) -> Message:
    """The message a wire tuple from ``encode`` stands for."""
    cls = _CLASSES[wire[0]]
    if cls is Done:
        at = _REPORT_AT + 1
        return tuple.__new__(
            Done, (*wire[1:at], tuple.__new__(BatchReport, wire[at]), *wire[at + 1:]))
    return tuple.__new__(cls, wire[1:])  # type: ignore[no-any-return]


# NOTE [ Plain messages skip the reducers ]
# ``Connection.send`` pickles with ``ForkingPickler``, whose construction copies copyreg's and
# torch's reducers (~84 entries) for every message, and frames it in Python: ~5 us a message
# more than plain pickle and ``os.write``/``os.read`` (measured on a TASK of 256 indices and
# a DONE, each way). The pickler consults reducers only for objects other than None, bools,
# ints, floats, str, bytes, bytearray and exact tuples, lists, dicts, sets (CPython's
# ``save``), so a message made of nothing else pickles to the same bytes either way: ``send``
# pickles plainly and stops at the first object of any other type (``reducer_override``),
# which sends the message ``ForkingPickler``'s way (a tensor among a task's indices goes to
# shared memory, as torch's index queue sends it). Frames are ``Connection``'s (a 4-byte
# big-endian length, or -1 and an 8-byte one past 2 GiB), written and read as it does, so
# ``Connection.recv`` on the other end reads them too.

_LONG = 0x7FFFFFFF  # Connection's limit for a 4-byte length
_ONE_WRITE = 16384  # Connection writes header and payload in one call up to this size


class _NotPlain(Exception):
    pass


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        raise _NotPlain  # any object whose pickling could involve a reducer


def _dumps(wire: tuple) -> bytes | memoryview:
    buf = io.BytesIO()
    try:
        _PlainPickler(buf).dump(wire)
    except _NotPlain:
        return ForkingPickler.dumps(wire)
    return buf.getvalue()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    while True:  # as Connection._send: a blocking socket may take part of it
        n = os.write(fd, data)
        if n == len(data):
            return
        data = data[n:]


def _write_frame(conn: Connection, payload: bytes | memoryview) -> None:
    fd, n = conn.fileno(), len(payload)
    if n > _LONG:
        _write_all(fd, struct.pack("!i", -1) + struct.pack("!Q", n))
        _write_all(fd, payload)
    elif n > _ONE_WRITE:
        _write_all(fd, struct.pack("!i", n))
        _write_all(fd, payload)
    else:
        _write_all(fd, struct.pack("!i", n) + payload)


def _read_exact(fd: int, size: int) -> bytes:
    chunk = os.read(fd, size)
    if len(chunk) == size:
        return chunk
    got = bytearray(chunk)
    while len(got) < size:  # as Connection._recv
        if not chunk:
            if not got:
                raise EOFError
            raise OSError("got end of file during message")
        chunk = os.read(fd, size - len(got))
        got += chunk
    return bytes(got)


def _read_frame(conn: Connection) -> Any:
    fd = conn.fileno()
    (size,) = struct.unpack("!i", _read_exact(fd, 4))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8))
    return pickle.loads(_read_exact(fd, size))


def send(conn: Connection, message: Message) -> None:
    """``message`` on the socket (NOTE [ Plain messages skip the reducers ])."""
    _write_frame(conn, _dumps(encode(message)))


def recv_from_main(conn: Connection) -> ToWorker:
    """The next message of the main process (a worker's side of the socket)."""
    return decode(_read_frame(conn))  # type: ignore[return-value]


def recv_from_worker(
    conn: Connection, unpacking: Callable[[], AbstractContextManager[Any]] | None = None,
    segments: MainSegments | None = None,
) -> FromWorker:
    """The next message of a worker (the main process's side of the socket). A ``Done`` whose
    batch has fds behind it, or reuses the worker's ``segments`` (NOTE [ torch's shared
    memory, reused ]), comes with its batch unpickled (``torch_way.Unpickled``), inside
    ``unpacking()`` (the profiler's range for receiving a batch)."""
    message = decode(_read_frame(conn))
    if isinstance(message, Done) and (message.fds or message.reused):
        assert isinstance(message.payload, bytes)
        try:
            fds = recv_fds(conn, message.fds) if message.fds else []
        except OSError as exc:  # NOTE [ Out of file descriptors ]: torch's error, when due
            if exc.errno != errno.EMFILE:
                raise
            batch = torch_way.Unpickled(None, torch_way.too_many_open_files(exc))
        else:
            with unpacking() if unpacking is not None else contextlib.nullcontext():
                batch = torch_way.received(message.payload, fds, segments)
        message = message._replace(payload=batch, fds=0, reused=False)
    return message  # type: ignore[return-value]


# -- fds beside the messages (a segment crosses as its fd: transport.segments) ----------------

_FDS_PER_MESSAGE = 250  # the kernel passes at most 253 (SCM_MAX_FD) in one message


def send_fd(conn: Connection, fd: int) -> None:
    """Pass ``fd`` over the Unix socket behind ``conn`` (SCM_RIGHTS). Unlike
    ``multiprocessing.reduction.send_handle``, no fd is duplicated to do it, so a process at
    its open-files limit can still hand over a segment it created."""
    send_fds(conn, [fd])


def send_fds(conn: Connection, fds: list[int]) -> None:
    """Pass ``fds`` (in order) as ``send_fd`` does, up to 250 in one message."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn.fileno())
    try:
        for i in range(0, len(fds), _FDS_PER_MESSAGE):
            chunk = array.array("i", fds[i : i + _FDS_PER_MESSAGE])
            sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, chunk)])
    finally:
        sock.detach()  # the socket is conn's: do not close it


def recv_fd(conn: Connection) -> int:
    """The fd ``send_fd`` passed; OSError(EMFILE) if this process had no slot left for it."""
    return recv_fds(conn, 1)[0]


def recv_fds(conn: Connection, count: int) -> list[int]:
    """The ``count`` fds ``send_fds`` passed; OSError(EMFILE) if this process had no slot
    left for them (the ones it did get are closed)."""
    got: list[int] = []
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=conn.fileno())
    try:
        passed, short = 0, False
        while passed < count:  # every message read, so the next one starts where it should
            want = min(_FDS_PER_MESSAGE, count - passed)
            passed += want
            space = socket.CMSG_SPACE(want * array.array("i").itemsize)
            msg, ancdata, _flags, _addr = sock.recvmsg(1, space)
            if not msg:
                raise EOFError("the worker closed its connection while passing a segment")
            fds = array.array("i")
            for level, kind, data in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            got.extend(fds)
            # the kernel drops fds (MSG_CTRUNC) when no slot is free
            short = short or len(fds) < want
        if short:
            raise OSError(
                errno.EMFILE, "Too many open files: the main process had no file "
                "descriptor left to receive a worker's shared memory (as under torch, "
                "each tensor of a batch you hold keeps one open); raise the limit "
                "(`ulimit -n`), keep fewer batches, call torch.multiprocessing."
                "set_sharing_strategy('file_system') as torch's docs advise, or pass "
                "beyond_torch={'slab_transport'} (no descriptor per batch)")
    except BaseException:
        for fd in got:
            os.close(fd)
        raise
    finally:
        sock.detach()
    return got


ToWorker = Task | Reset | Cancel | Release | Stop
"""What the main process sends."""
Reply = Done | Failed | Exhausted | Cancelled
"""A task's answer: each ``Task`` gets exactly one (or none after a late ``Cancel``)."""
FromWorker = Hello | Slab | Reply | Started
"""What a worker sends."""
Message = ToWorker | FromWorker
