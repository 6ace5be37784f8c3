"""Carry an exception raised in a worker back to the main process, unchanged.

torch rebuilds worker exceptions as ``type(msg)`` from a string, so a custom exception whose
constructor takes two arguments comes back as a bare ``RuntimeError`` and loses its attributes.
stoker pickles the exception *object* (class, args and ``__dict__``, rebuilt without calling
``__init__``), chains the worker's formatted traceback as ``__cause__`` (like
``concurrent.futures``) and adds a note naming the worker and the sample indices.
"""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass
from typing import Any

from stoker.errors import RemoteTraceback, WorkerError

_MAX_INDICES_SHOWN = 16


@dataclass(frozen=True)
class RemoteError:
    """A worker-side exception in transit."""

    pickled: bytes | None  # None when the exception could not be pickled
    type_name: str
    tb_text: str
    where: str


def _rebuild(cls: type[BaseException], args: tuple, state: dict[str, Any]) -> BaseException:
    # BaseException.__new__ sets .args without running a user __init__ that may need other
    # arguments; the instance dict then restores every attribute __init__ had set.
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class _Carrier:
    """Pickles as a call to ``_rebuild`` that yields the exception itself."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple:
        exc = self.exc
        return (_rebuild, (type(exc), exc.args, dict(getattr(exc, "__dict__", {}))))


def _pickle_exception(exc: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(_Carrier(exc))
        pickle.loads(data)  # prove it rebuilds here, where failing is cheap
        return data
    except Exception:
        return None


def describe_indices(indices: Any) -> str:
    if isinstance(indices, list):
        if all(i is None for i in indices):  # iterable datasets have no indices
            return f"a batch of {len(indices)} samples from the iterable dataset"
        shown = indices[:_MAX_INDICES_SHOWN]
        more = f" ... ({len(indices)} in all)" if len(indices) > len(shown) else ""
        return f"sample indices {shown}{more}"
    if indices is None:
        return "the next sample of the iterable dataset"
    return f"sample index {indices!r}"


_CUDA_IN_WORKER = ("CUDA error: initialization error", "re-initialize CUDA in forked subprocess")
CUDA_HINT = (
    "stoker: this worker used CUDA (in __getitem__, collate_fn or worker_init_fn), which a "
    "worker process cannot do once the main process has initialised CUDA. Return CPU tensors "
    "from the dataset and move each batch to the GPU in the training loop "
    "(batch.to(device, non_blocking=True)), or start workers with "
    "multiprocessing_context='spawn'."
)


def capture(exc: BaseException, worker_id: int, doing: str) -> RemoteError:
    """Package ``exc`` (being handled now) for the trip to the main process.

    ``doing`` completes "while ...", e.g. ``"loading sample indices [3, 4]"``.
    """
    where = f"in DataLoader worker {worker_id} (pid {os.getpid()}) while {doing}"
    if any(marker in str(exc) for marker in _CUDA_IN_WORKER):
        add_note(exc, CUDA_HINT)
    tb_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RemoteError(_pickle_exception(exc), type(exc).__qualname__, tb_text, where)


def add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: same attribute, shown by 3.11+ tracebacks and by traceback2-aware tools
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def rebuild(err: RemoteError) -> BaseException:
    """The exception to raise in the main process, with the worker traceback chained."""
    exc: BaseException | None = None
    if err.pickled is not None:
        try:
            exc = pickle.loads(err.pickled)
        except Exception:
            exc = None
    if exc is None:
        exc = WorkerError(
            f"Caught {err.type_name} {err.where}, and it could not be sent to the main process "
            f"(it does not pickle). The worker's traceback:\n{err.tb_text}"
        )
    else:
        add_note(exc, f"stoker: raised {err.where}; the worker's traceback is chained above.")
    exc.__cause__ = RemoteTraceback(err.tb_text)
    return exc
