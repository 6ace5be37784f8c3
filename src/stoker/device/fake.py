"""A CPU stand-in for a CUDA device, for testing what schedules copies without a GPU.

``FakeDevice`` implements ``DeviceBackend``: work queued on its streams (copies, event
records, waits, compute the test adds) runs only when the test calls ``run()``, in stream
order, each stream with its own clock (copies take ``nbytes / bandwidth`` seconds, waits move
a stream's clock to the event's time). So a test can hold the "GPU" back and check what the
host side does meanwhile: which host batches it keeps, what it hands out, which events it
waits on, and whether a copy read the bytes it was meant to (a copy reads its source when it
*runs*, so a slab overwritten too early shows up as wrong data).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch


class FakeEvent:
    def __init__(self, gpu: FakeDevice) -> None:
        self._gpu = gpu
        self.recorded = False
        self.done = True  # an event never recorded counts as complete (as CUDA's)
        self.time_s = 0.0

    def record(self, stream: FakeStream) -> None:
        self.recorded, self.done = True, False
        stream.ops.append(("record", self))

    def query(self) -> bool:
        return self.done

    def wait(self, stream: Any) -> None:
        stream.ops.append(("wait", self))

    def synchronize(self) -> None:
        self._gpu.run(until=lambda: self.done)

    def elapsed_s(self, end: Any) -> float:
        assert self.done and end.done, "elapsed_s needs both events complete"
        return float(end.time_s - self.time_s)


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ops: list[tuple[str, Any]] = []
        self.clock_s = 0.0
        self.log: list[str] = []  # kinds of the ops run, in order (no references kept)

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeDevice:
    """See the module docstring. ``refuse`` makes ``host_register`` fail with that reason."""

    def __init__(self, bandwidth_bytes_per_s: float = 1e9, refuse: str | None = None) -> None:
        self.device = torch.device("cpu")
        self.bandwidth = bandwidth_bytes_per_s
        self.refuse = refuse
        self.default = FakeStream("default")
        self.streams: list[FakeStream] = [self.default]
        self._current = threading.local()
        self.kept: list[tuple[int, FakeStream]] = []  # (data_ptr, stream) record_stream calls
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []
        self.synchronized = 0

    # -- DeviceBackend --------------------------------------------------------------------

    def new_stream(self) -> FakeStream:
        stream = FakeStream(f"side{len(self.streams)}")
        self.streams.append(stream)
        return stream

    def current_stream(self) -> FakeStream:
        return getattr(self._current, "stream", self.default)

    @contextlib.contextmanager
    def on_stream(self, stream: FakeStream) -> Iterator[None]:
        previous = self.current_stream()
        self._current.stream = stream
        try:
            yield
        finally:
            self._current.stream = previous

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(tensor)
        out._stoker_fake_device = True  # type: ignore[attr-defined]  # "on the device"
        self.current_stream().ops.append(("copy", (tensor, out)))
        return out

    def keep_until_used(self, tensor: torch.Tensor, stream: Any) -> None:
        self.kept.append((tensor.data_ptr(), stream))

    def host_register(self, address: int, nbytes: int) -> str | None:
        if self.refuse is not None:
            return self.refuse
        assert address not in self.registered, "registered twice"
        self.registered[address] = nbytes
        return None

    def host_unregister(self, address: int) -> None:
        del self.registered[address]
        self.unregistered.append(address)

    def synchronize(self) -> None:
        self.synchronized += 1
        self.run()

    def where(self, tensor: torch.Tensor) -> str:
        return "device" if getattr(tensor, "_stoker_fake_device", False) else "host"

    # -- the test's side ------------------------------------------------------------------

    def compute(self, seconds: float, stream: FakeStream | None = None) -> None:
        """Queue ``seconds`` of work on ``stream`` (the current one by default)."""
        (stream or self.current_stream()).ops.append(("compute", seconds))

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run queued work until nothing can progress (or ``until()`` holds)."""
        progressed = True
        while progressed and not (until is not None and until()):
            progressed = False
            for stream in self.streams:
                while stream.ops and self._step(stream):
                    progressed = True
                    if until is not None and until():
                        return
        if until is not None and not until():
            raise AssertionError("fake device: waited on an event nothing will record")

    def _step(self, stream: FakeStream) -> bool:
        kind, arg = stream.ops[0]
        if kind == "wait":
            if not arg.done:
                return False
            stream.clock_s = max(stream.clock_s, arg.time_s)
        elif kind == "record":
            arg.time_s, arg.done = stream.clock_s, True
        elif kind == "copy":
            src, dst = arg
            dst.copy_(src)  # reads the source now: a source overwritten too early shows
            stream.clock_s += src.numel() * src.element_size() / self.bandwidth
        elif kind == "compute":
            stream.clock_s += arg
        stream.ops.pop(0)
        stream.log.append(kind)
        return True
