"""stoker's exceptions. Each subclasses the builtin a user already catches.

    Exception
     ├── RuntimeError
     │    └── StokerError
     │         ├── WorkerError          a worker failed and the original error could not travel
     │         ├── WorkerDiedError      a worker process exited or was killed mid-epoch
     │         ├── LoaderTimeoutError   no batch within ``timeout`` seconds (torch's message)
     │         ├── SkipBudgetExceeded   on_error="skip" skipped more samples than allowed
     │         ├── MixedDeviceError     a batch's samples are on different devices
     │         ├── CudaInWorkersError   cuda_forkserver: a dataset that does not pickle
     │         ├── RemoteReadError      an object-store read failed for good (an OSError too)
     │         ├── ShardError           a shard or record file is not what its index says
     │         ├── DeviceUnavailableError  device= names a device this process cannot use
     │         └── BatchDeviceError     device=: a batch holds a tensor on another accelerator
     │    (the last two are ValueErrors too)
     ├── RemoteTraceback                the worker-side traceback, chained as ``__cause__``
     └── Warning
          └── UserWarning               (the ``category`` of stoker's log records; no longer
               │                         issued through ``warnings``)
               ├── StallWarning         no batch for ``stall_warning_s``; the loader waits on
               └── CopyOnReadWarning    a worker's private memory grows steadily
    KeyboardInterrupt
     └── PackInterrupted                Ctrl-C stopped a pack; the same command resumes it
"""

from __future__ import annotations


class StokerError(RuntimeError):
    """Base class of every error stoker raises itself.

    What to do: catch ``stoker.StokerError`` (or ``RuntimeError``, where torch raised one) to
    handle any of them; the message of each subclass names the cause and the change to make.
    """


class WorkerError(StokerError):
    """An error in a worker whose original exception could not be rebuilt in the main process.

    stoker re-raises a worker's exception as itself (type, arguments, attributes); this class
    stands in only when that object cannot travel between processes at all. The worker's
    traceback is chained as ``__cause__`` and a note names the worker and the samples.

    What to do: read the chained worker traceback; to get the original type back, make the
    exception picklable (keep its constructor arguments in ``args``).
    """


class WorkerDiedError(StokerError):
    """A worker process exited or was killed while the loader still needed it.

    The message names the worker id, its pid, the signal or exit code, the samples it held
    and the likely cause: SIGKILL is most often the kernel's OOM killer, SIGBUS a full
    shared-memory filesystem, SIGSEGV a crash in native code (its stacks are attached).

    What to do: for SIGKILL, lower ``num_workers`` or the memory each worker holds (see
    ``CopyOnReadWarning``); for SIGBUS in a container, raise ``--shm-size``; for SIGSEGV, run
    the failing samples with ``num_workers=0`` to see the native crash in the main process.
    """


class LoaderTimeoutError(StokerError):
    """No batch arrived within the loader's ``timeout``.

    The text is torch's; a note adds which worker was late, its samples and its Python stack.

    What to do: look at the stack in the note (a sample that blocks on I/O or a lock); raise
    ``timeout`` if such slow batches are expected, or pass ``timeout=0`` to wait for ever.
    """


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; chained as ``__cause__`` of the re-raised error.

    Never raised on its own: it is the "The above exception was the direct cause" part of a
    worker's error, showing where in the worker the original exception was raised.

    What to do: nothing; read it as the worker-side half of the traceback.
    """

    def __init__(self, tb_text: str) -> None:
        super().__init__(tb_text)
        self.tb_text = tb_text

    def __str__(self) -> str:
        return self.tb_text


class SkipBudgetExceeded(StokerError):
    """``on_error="skip"`` skipped more samples in an epoch than ``skip_budget`` allows.

    What to do: fix the failing samples (the message names the first errors), or
    raise ``skip_budget`` (a count, or a fraction of the epoch) if that many bad samples are
    expected.
    """


class MixedDeviceError(StokerError):
    """default_collate was asked to stack tensors that live on different devices.

    ``positions`` maps each device to the batch positions on it; ``with_indices`` restates
    the message with the dataset's sample indices once the caller knows them.

    What to do: return CPU tensors from ``__getitem__`` (move GPU-made data such as
    pseudo-labels to the CPU before it goes into the dataset) and move whole batches to the
    device in the training loop, or with ``DataLoader(device=...)``.
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
    changed after the index was built. The message names the file and the sample.

    What to do: the message says which file; re-create that shard (``stoker pack`` again, or
    ``stoker.formats.index_shard`` for a shard from elsewhere), or remove it from the list.
    """


class PackError(StokerError):
    """``stoker pack`` cannot go on as asked (a sample it cannot pack, a worker that died, an
    output directory inside the source); the message names the sample or file, says what was
    kept and what to change.

    What to do: fix the sample the message names (same name, same count) and run the same
    command again: finished shards are kept and the pack resumes.
    """


class PackInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGINT) stopped ``stoker pack`` / ``stoker.formats.pack``; the message says
    how many shards are finished and kept. A ``KeyboardInterrupt``, so code that stops on
    Ctrl-C still does.

    What to do: run the same command (or call) again: the finished shards are kept and the
    pack resumes after them.
    """


class RemoteReadError(OSError, StokerError):
    """A read from an object store failed for good (after its retries, or at once for a
    permanent error). ``url``, ``offset``, ``length``, ``attempts`` say which read; the last
    error is chained as ``__cause__``.

    What to do: read the chained error: missing credentials (configure the store's standard
    credential chain or pass ``storage_options``), a server that ignores byte ranges (use
    ``fetch="shard"`` with a cache), or a store that keeps failing (a ``RetryPolicy`` with more
    attempts).
    """

    url: str = ""
    offset: int | None = None
    length: int | None = None
    attempts: int = 0


class CudaInWorkersError(StokerError):
    """Workers cannot start where CUDA is: ``beyond_torch`` asks for ``cuda_forkserver``, CUDA
    is already initialised here, so workers start with ``forkserver``, and the dataset (or
    ``collate_fn``, ``worker_init_fn``) does not pickle (the message says what does not).

    What to do: define the dataset's classes and functions at module level, or leave
    ``cuda_forkserver`` off (workers are forked as torch forks them, and must not use CUDA:
    keep the dataset's tensors on the CPU and move batches to the GPU in the training loop).
    """


class DeviceUnavailableError(StokerError, ValueError):
    """``DataLoader(device=...)`` names a device this process cannot use.

    What to do: pass a device that exists here (``torch.cuda.device_count()``), or leave
    ``device=None`` on a machine without one and move batches in the loop.
    """


class BatchDeviceError(StokerError, ValueError):
    """With ``device=``, a batch holds a tensor on another accelerator than that device.

    What to do: return CPU tensors from the dataset and collate; ``device=`` copies them.
    """


class StallWarning(UserWarning):
    """No batch arrived for longer than ``stall_warning_s``; the loader keeps waiting.

    The report names the late worker, its samples and its current Python stack. It is a
    WARNING record on the ``stoker.engine.worker_group`` logger, not a ``warnings`` warning:
    the run may still succeed, and torch's DataLoader says nothing there (a ``-W error`` run
    must not stop on it). The record carries this class as its ``category`` attribute (a
    ``logging.Filter`` can pick it out).

    What to do: if the stack shows a sample stuck (a network read without a timeout, a lock),
    fix that; if such slow batches are expected, raise ``stall_warning_s`` or pass ``None``;
    to fail instead of waiting, set ``timeout=<seconds>``.
    """


class CopyOnReadWarning(UserWarning):
    """A DataLoader worker's private memory grows steadily (most often copy-on-read).

    Kept in ``loader.stats().advice`` and logged once per loader at DEBUG on the
    ``stoker.profile.memory_watch`` logger; not through ``warnings`` nor on stderr, where
    torch's DataLoader says nothing on a run that succeeds (NOTE [ Advice is quiet ]). The
    record carries this class as its ``category`` attribute (a ``logging.Filter`` can pick it
    out).

    What to do: keep the list the message names in a shared container
    (``stoker.sharing.SharedStrList`` and its kin, the exact line is in the message), or pass
    ``beyond_torch={"shared_lists"}``; ``STOKER_MEMORY_WATCH=0`` turns the check off.
    """
