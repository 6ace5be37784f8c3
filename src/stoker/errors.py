"""stoker's exceptions. Each subclasses the builtin a user already catches.

    Exception
     ├── RuntimeError
     │    └── StokerError
     │         ├── WorkerError          a worker failed and the original error could not travel
     │         ├── WorkerDiedError      a worker process exited or was killed mid-epoch
     │         ├── LoaderTimeoutError   no batch within ``timeout`` seconds (torch's message)
     │         ├── SkipBudgetExceeded   on_error="skip" skipped more samples than allowed
     │         ├── MixedDeviceError     a batch's samples are on different devices
     │         ├── CudaInWorkersError   the loader would carry CUDA into worker processes
     │         ├── RemoteReadError      an object-store read failed for good (an OSError too)
     │         ├── ShardError           a shard or record file is not what its index says
     │         ├── DeviceUnavailableError  device= names a device this process cannot use
     │         └── BatchDeviceError     device=: a batch holds a tensor on another accelerator
     │    (the last two are ValueErrors too)
     ├── RemoteTraceback                the worker-side traceback, chained as ``__cause__``
     └── Warning
          └── UserWarning
               ├── StallWarning         no batch for ``stall_warning_s``; the loader waits on
               └── CopyOnReadWarning    a worker's private memory grows steadily
"""

from __future__ import annotations


class StokerError(RuntimeError):
    """Base class of every error stoker raises itself."""


class WorkerError(StokerError):
    """An error in a worker whose original exception could not be rebuilt in the main process."""


class WorkerDiedError(StokerError):
    """A worker process exited or was killed while the loader still needed it."""


class LoaderTimeoutError(StokerError):
    """No batch arrived within the loader's ``timeout``."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; chained as ``__cause__`` of the re-raised error."""

    def __init__(self, tb_text: str) -> None:
        super().__init__(tb_text)
        self.tb_text = tb_text

    def __str__(self) -> str:
        return self.tb_text


class SkipBudgetExceeded(StokerError):
    """``on_error="skip"`` skipped more samples in an epoch than ``skip_budget`` allows."""


class MixedDeviceError(StokerError):
    """default_collate was asked to stack tensors that live on different devices.

    ``positions`` maps each device to the batch positions on it; ``with_indices`` restates
    the message with the dataset's sample indices once the caller knows them.
    """

    def __init__(self, positions: dict[str, list[int]], indices: list | None = None) -> None:
        self.positions = positions
        self.indices = indices
        super().__init__(self._message())

    def _message(self) -> str:
        def where(batch_positions: list[int]) -> str:
            if self.indices is not None:
                return f"samples {[self.indices[p] for p in batch_positions]}"
            return f"batch positions {batch_positions}"

        parts = ", ".join(f"{where(p)} are on {d}" for d, p in self.positions.items())
        return (
            f"Cannot collate a batch whose tensors are on different devices: {parts}. Keep "
            "every sample on one device: return CPU tensors from __getitem__ (move GPU-made "
            "data such as pseudo-labels to the CPU with .cpu() before it goes into the "
            "dataset) and move whole batches to the GPU in the training loop with "
            "batch.to(device, non_blocking=True)."
        )

    def with_indices(self, indices: list) -> MixedDeviceError:
        return MixedDeviceError(self.positions, indices)

    def __reduce__(self) -> tuple:
        return (MixedDeviceError, (self.positions, self.indices))


class ShardError(StokerError):
    """A shard (or record file) cannot be read as its index says: truncated, corrupted, or
    changed after the index was built. The message names the file and the sample."""


class PackError(StokerError):
    """``stoker pack`` cannot go on as asked (a sample it cannot pack, a worker that died, an
    output directory inside the source); the message names the sample or file, says what was
    kept and what to change."""


class RemoteReadError(OSError, StokerError):
    """A read from an object store failed for good (after its retries, or at once for a
    permanent error). ``url``, ``offset``, ``length``, ``attempts`` say which read; the last
    error is chained as ``__cause__``."""

    url: str = ""
    offset: int | None = None
    length: int | None = None
    attempts: int = 0


class CudaInWorkersError(StokerError):
    """The loader would carry CUDA into worker processes, where it cannot work."""


class DeviceUnavailableError(StokerError, ValueError):
    """``DataLoader(device=...)`` names a device this process cannot use."""


class BatchDeviceError(StokerError, ValueError):
    """With ``device=``, a batch holds a tensor on another accelerator than that device."""


class StallWarning(UserWarning):
    """No batch arrived for longer than ``stall_warning_s``; the loader keeps waiting."""


class CopyOnReadWarning(UserWarning):
    """A DataLoader worker's private memory grows steadily (most often copy-on-read).

    A ``UserWarning`` rather than a ``ResourceWarning``: Python's default filters hide every
    ``ResourceWarning``, and this one is meant to be seen.
    """
