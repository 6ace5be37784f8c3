"""The few device operations the feed and the slab pinning need, behind one small interface.

Everything that schedules copies (``feed``), pins slabs (``host_pins``) or measures them asks a
``DeviceBackend`` for streams, events, copies and page-locking, never ``torch.cuda`` directly.
``CudaBackend`` is the real one; the unit tests drive the same scheduling code with a fake
backend on the CPU, whose events complete when the test says so.

Semantics the real backend relies on (torch 2.13, CUDA):

* ``Tensor.to(device, non_blocking=True)`` under ``torch.cuda.stream(s)`` allocates the result
  from the caching allocator *for stream s* and enqueues the copy on s. From page-locked host
  memory the call returns at once; from pageable memory it returns once the bytes are staged.
* An event recorded on s completes when everything enqueued on s before it has run;
  ``Event.wait(stream)`` makes later work on another stream wait for it, with no host sync
  (the feed's events are wrappers: torch's ``Stream.wait_event`` would call ``wait`` on them,
  so the feed calls the event, never the stream).
* A block allocated for s and used on stream c must be ``record_stream(c)``-ed, else freeing
  it lets the allocator hand it to the next copy on s while c still reads it.
* ``cudart().cudaHostRegister(ptr, n, cudaHostRegisterPortable)`` page-locks memory in place
  (it then reports ``is_pinned()`` and copies from it are asynchronous); it must be undone with
  ``cudaHostUnregister`` before the memory is unmapped, and never while a copy still reads it.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from stoker.errors import DeviceUnavailableError

_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context


class Event(Protocol):
    def record(self, stream: Any) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def wait(self, stream: Any) -> None:
        """Make later work on ``stream`` wait for this event, with no host sync."""
        ...

    def elapsed_s(self, end: Event) -> float:
        """Seconds of device time from this event to ``end`` (both complete)."""
        ...


class Stream(Protocol):
    """Opaque to the feed: made and made current by the backend, waited on by events."""


class DeviceBackend(Protocol):
    @property
    def device(self) -> torch.device: ...

    def new_stream(self) -> Stream: ...

    def current_stream(self) -> Stream: ...

    def on_stream(self, stream: Stream) -> contextlib.AbstractContextManager[Any]: ...

    def new_event(self) -> Event: ...

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the device, copied on the current stream without a host sync."""
        ...

    def keep_until_used(self, tensor: torch.Tensor, stream: Stream) -> None:
        """Tell the allocator ``tensor`` is used on ``stream`` (``record_stream``)."""
        ...

    def host_register(self, address: int, nbytes: int) -> str | None:
        """Page-lock host memory in place; None on success, else why it was refused."""
        ...

    def host_unregister(self, address: int) -> None: ...

    def synchronize(self) -> None:
        """Wait for all work on the device (every stream)."""
        ...

    def where(self, tensor: torch.Tensor) -> str:
        """``"host"`` (CPU), ``"device"`` (this device) or ``"other"``."""
        ...


class _CudaEvent:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = torch.cuda.Event(enable_timing=True)

    def record(self, stream: Any) -> None:
        self._event.record(stream)

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def wait(self, stream: Any) -> None:
        self._event.wait(stream)

    def elapsed_s(self, end: Event) -> float:
        assert isinstance(end, _CudaEvent)
        return float(self._event.elapsed_time(end._event)) / 1000.0


def _clear_last_cuda_error() -> None:
    """A refused ``cudaHostRegister`` leaves its error as the thread's "last error", which a
    later, unrelated kernel-launch check in torch would report. Reset it (best effort:
    torch's Python bindings have no ``cudaGetLastError``; torch loads libcudart globally)."""
    try:
        get_last_error = ctypes.CDLL(None).cudaGetLastError
    except (AttributeError, OSError):
        return
    get_last_error()


class CudaBackend:
    """The real backend: one CUDA device."""

    def __init__(self, device: torch.device | None) -> None:
        self._device = device  # None: the current device, read when first needed

    @property
    def device(self) -> torch.device:
        if self._device is None:
            self._device = torch.device("cuda", torch.cuda.current_device())
        return self._device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def on_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)  # also makes the stream's device current

    def new_event(self) -> Event:
        return _CudaEvent()

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)

    def keep_until_used(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def host_register(self, address: int, nbytes: int) -> str | None:
        cudart = torch.cuda.cudart()
        result = cudart.cudaHostRegister(address, nbytes, _HOST_REGISTER_PORTABLE)
        code = int(result)
        if code == 0:
            return None
        _clear_last_cuda_error()
        try:  # the binding takes the cudaError value it returned
            text = str(cudart.cudaGetErrorString(result))
        except Exception:
            text = "no description"
        return f"cudaHostRegister returned error {code} ({text})"

    def host_unregister(self, address: int) -> None:
        if int(torch.cuda.cudart().cudaHostUnregister(address)) != 0:
            _clear_last_cuda_error()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def where(self, tensor: torch.Tensor) -> str:
        device = tensor.device
        if device.type == "cpu":
            return "host"
        return "device" if device == self.device else "other"


def resolve_device(device: Any) -> torch.device | None:
    """The CUDA device ``device=`` names, None for the CPU (batches stay on the host)."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise DeviceUnavailableError(
            f"device={device!r} is not a device: {exc}. Pass a CUDA device such as "
            "device='cuda' or device=torch.device('cuda', local_rank), or leave device=None "
            "to receive batches on the CPU."
        ) from None
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise DeviceUnavailableError(
            f"device={device!r}: stoker delivers batches on CUDA devices only. Leave "
            "device=None and move each batch yourself with batch.to(device)."
        )
    if not torch.cuda.is_available():
        build = "this torch is a CPU-only build" if torch.version.cuda is None else (
            "torch.cuda.is_available() is False (no GPU visible to this process: check "
            "CUDA_VISIBLE_DEVICES and the driver)"
        )
        raise DeviceUnavailableError(
            f"device={device!r} needs CUDA, but {build} (torch {torch.__version__}). Leave "
            "device=None to receive batches on the CPU, or install a CUDA build of torch "
            "and run where a GPU is visible."
        )
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device={device!r}: this process sees {torch.cuda.device_count()} CUDA "
            f"device(s) (cuda:0..cuda:{torch.cuda.device_count() - 1}); pass one of those."
        )
    return dev


@contextlib.contextmanager
def no_scope() -> Iterator[None]:
    yield
