"""The worker spec pickled once for every spawn/forkserver worker, large buffers shared.

NOTE [ Pickle once ]
Beyond torch (``beyond_torch={"pickle_once"}``: a dataset's ``__getstate__`` runs once, not
once per worker, and its workers' arrays view a shared mapping; by default spawn/forkserver
workers are started as torch starts them, each pickling its own arguments).
``multiprocessing`` pickles a spawned process's arguments once per process: a dataset holding
a 1 GiB array is pickled, written through a pipe and unpickled once per worker, and every
worker ends up with a private copy. Instead, ``pickle_once`` pickles the spec (dataset,
collate_fn, worker_init_fn, ...) a single time, protocol 5, with large contiguous buffers
(numpy arrays, bytearrays) out of band, and writes the pickle and the buffers into one
shared-memory segment. Each worker gets only a small ``SpecHandle`` (the segment's fd and
where each buffer lies), maps the segment copy-on-write and unpickles from it: its arrays
view the mapping, so reading them shares one copy between all workers, and a worker that
writes into an array writes into its own page copy, as a worker forked from the main process
would. Workers unpickle side by side.

Objects that travel as file descriptors (tensors in shared memory, stoker's shared lists)
ask ``multiprocessing`` for the process being started while they are pickled. Here that is
``_FdRecorder``: it keeps a duplicate of each fd, and every worker's start hands all of them
to that worker, where ``_InheritedFd`` finds them by position.
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import os
import pickle
from multiprocessing import context as mp_context
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

from stoker._core.specs import WorkerSpec
from stoker.transport import segments

OUT_OF_BAND_MIN_BYTES = 1 << 16  # smaller buffers stay inside the pickle
_ALIGN = 64  # every buffer starts aligned for any dtype (and a cache line)

_inherited: list[int] = []  # in a worker: the fds its start handed over, by position
_detached: set[int] = set()


class _InheritedFd:
    """An fd recorded while pickling, found in the worker by its position."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        _detached.add(self.index)
        return _inherited[self.index]


class _FdRecorder:
    """Stands in for ``multiprocessing``'s process being started while the spec is pickled."""

    DupFd = _InheritedFd

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(os.dup(fd))  # ours: the object's own fd may close before a start
        return len(self.fds) - 1


class _SpecPickler(pickle.Pickler):
    """``ForkingPickler``'s reducers (torch's tensors, stoker's lists) with protocol 5."""

    def __init__(self, file: io.BytesIO, buffer_callback: Any) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        table = copyreg.dispatch_table.copy()
        table.update(ForkingPickler._extra_reducers)  # type: ignore[attr-defined]
        self.dispatch_table = table


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class PickledSpec:
    """The main process's side: the segment and recorded fds, open until ``close``."""

    def __init__(self, spec: WorkerSpec) -> None:
        import torch.multiprocessing  # noqa: F401  (registers torch's reducers)

        buffers: list[memoryview] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            try:
                raw = buffer.raw()
            except BufferError:  # not contiguous: stays in the pickle
                return True
            if raw.nbytes < OUT_OF_BAND_MIN_BYTES:
                return True
            buffers.append(raw)
            return False

        recorder = _FdRecorder()
        self._fds = recorder.fds
        self.fd = -1
        stream = io.BytesIO()
        previous = mp_context.get_spawning_popen()
        mp_context.set_spawning_popen(recorder)  # type: ignore[arg-type]
        try:
            _SpecPickler(stream, out_of_band).dump(spec)
        except BaseException:
            self.close()
            raise
        finally:
            mp_context.set_spawning_popen(previous)
        payload = stream.getbuffer()
        spans = []
        end = _aligned(payload.nbytes)
        for raw in buffers:
            spans.append((end, end + raw.nbytes, raw.readonly))
            end = _aligned(end + raw.nbytes)
        self.payload_bytes = payload.nbytes
        self.spans = tuple(spans)
        self.nbytes = max(end, 1)
        self._write(payload, buffers)

    def _write(self, payload: memoryview, buffers: list[memoryview]) -> None:
        self.fd = segments.create_untracked(self.nbytes)
        mapping = segments.map_segment(self.fd, self.nbytes)
        try:
            mapping[: payload.nbytes] = payload
            for (start, stop, _), raw in zip(self.spans, buffers, strict=True):
                mapping[start:stop] = raw.cast("B")
        finally:
            mapping.close()

    def handle(self) -> SpecHandle:
        return SpecHandle(self)

    def close(self) -> None:
        """After every worker started: each has its own copies of the fds by then."""
        for fd in [self.fd, *self._fds]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = -1
        self._fds.clear()


class SpecHandle:
    """What each worker's start pickles: the segment and the recorded fds as fds."""

    def __init__(self, pickled: PickledSpec) -> None:
        self._pickled = pickled

    def __reduce__(self) -> tuple[Any, ...]:
        # Called while multiprocessing pickles a starting worker's arguments, so DupFd hands
        # each fd to that worker (spawn: inherited; forkserver: sent along).
        p = self._pickled
        fds = [DupFd(fd) for fd in p._fds]
        return (_LoadedHandle, (DupFd(p.fd), p.nbytes, p.payload_bytes, p.spans, fds))


class _LoadedHandle:
    """In a worker: the handed-over fds, until ``load`` turns them into the spec."""

    def __init__(
        self, segment: Any, nbytes: int, payload_bytes: int, spans: tuple, fds: list[Any]
    ) -> None:
        self._fd = segment.detach()
        self._nbytes = nbytes
        self._payload_bytes = payload_bytes
        self._spans = spans
        self._fds = [f.detach() for f in fds]

    def load(self, worker_id: int) -> WorkerSpec:
        mapping = segments.map_private(self._fd, self._nbytes)
        os.close(self._fd)
        view = memoryview(mapping)
        # An array read-only in the main process stays read-only here, as under fork.
        buffers = [
            view[start:stop].toreadonly() if readonly else view[start:stop]
            for start, stop, readonly in self._spans
        ]
        _inherited[:] = self._fds
        _detached.clear()
        try:
            spec = pickle.loads(view[: self._payload_bytes], buffers=buffers)
        finally:
            for i, fd in enumerate(_inherited):
                if i not in _detached:  # nothing in the spec took it
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            _inherited.clear()
        return dataclasses.replace(spec, worker_id=worker_id)
