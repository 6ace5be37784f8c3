"""Carry an exception raised in a worker back to the main process, unchanged.

torch rebuilds worker exceptions as ``type(msg)`` from a string, so a custom exception whose
constructor takes two arguments comes back as a bare ``RuntimeError`` and loses its attributes.
stoker carries the exception's class and its state (``args``, the attributes builtin types keep
outside ``__dict__`` such as ``OSError.filename``, and ``__dict__``) and rebuilds it without
calling ``__init__``; it chains the worker's formatted traceback as ``__cause__`` (like
``concurrent.futures``) and adds a note naming the worker and the sample indices.

NOTE [ Exceptions that do not pickle ]
An exception holding a lock or a lambda still comes back as its own type, never as a stoker
class: torch re-raises ``type(msg)`` there, so ``except ValueError:`` catches it, and so must it
under stoker. The values that do not pickle are left out (an argument is replaced by its
``repr``), the main process calls the constructor with the arguments that travelled (torch calls
it with the message) so attributes ``__init__`` makes are made again, and a note names what was
left out. An exception that cannot be rebuilt from its state (a ``__new__`` that wants other
arguments) is rebuilt as torch does it (NOTE [ A worker's exception has torch's type ]). Only
when the class itself cannot be pickled (defined inside a function) does the error become
``WorkerError``: torch's worker fails to send it at all and the loader waits for ever.

NOTE [ A worker's exception has torch's type ]
torch re-raises what its ``ExceptionWrapper.reraise`` builds from the class and a message:
``cls(message)``, ``cls(message=...)`` for a class with a ``message`` attribute, and
``RuntimeError`` where the class cannot be built from one string (``json.JSONDecodeError``,
``UnicodeDecodeError``, a constructor with two arguments). The type decides which ``except``
clause catches it, so a program that catches ``RuntimeError`` and goes on must go on under
stoker too. The main process therefore runs torch's own ``reraise`` on the class and torch's
message (so the constructor runs once there, as under torch). Where that yields the class
itself, the original exception is raised, whole; where it yields another type, that exception
is raised (torch's message, type and arguments) with the original, whole, as its ``__cause__``.
stoker's own errors (``MixedDeviceError``) are raised whole: each subclasses the type torch
raises in its place. The worker's traceback is cut to the frames from torch's worker loop down,
as torch formats it.
"""

from __future__ import annotations

import os
import pickle
import traceback
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import get_worker_info

from stoker._core.notes import add_note
from stoker._core.walk import iter_attributes
from stoker.errors import RemoteTraceback, WorkerError
from stoker.fetch.fetchers import UNKNOWN, failed_index

_MAX_INDICES_SHOWN = 16
_SLOT_TYPES = (types.MemberDescriptorType, types.GetSetDescriptorType)
# Not carried: BaseException's own (args is carried apart; the rest is per-raise), and
# AttributeError.obj, the object that lacked the attribute: often the whole dataset, which
# would be pickled with every such error (torch does not carry it either).
_NOT_CARRIED = frozenset({*vars(BaseException), *vars(object), "__weakref__"})
_NOT_CARRIED_FROM: dict[type, str] = {AttributeError: "obj"}


@dataclass(frozen=True)
class RemoteError:
    """A worker-side exception in transit."""

    pickled: bytes | None  # the whole exception (a ``_Carrier``); None when it did not pickle
    pickled_type: bytes | None  # its class; None when that did not pickle either
    pickled_state: bytes | None  # without ``pickled``: (args, slots, __dict__) less what did not
    type_name: str
    tb_text: str  # formatted from torch's worker loop down, as torch's worker formats it
    where: str  # stoker's: worker, pid, what it was loading
    torch_where: str  # torch's: "in DataLoader worker process <id>"
    left_out: tuple[str, ...] = ()  # what did not pickle, as the note names it
    construct: bool = False  # every argument travelled: the main process may call __init__


def _slot_names(cls: type) -> list[str]:
    """Attributes kept outside ``__dict__``: builtin ones (``OSError.filename``,
    ``UnicodeError.start``, ``StopIteration.value``) and ``__slots__``. Pickling an exception
    restores them only through its constructor (``OSError.filename`` not even then)."""
    names: list[str] = []
    for klass in cls.__mro__:
        for name, attr in vars(klass).items():
            if not isinstance(attr, _SLOT_TYPES) or name in _NOT_CARRIED or name in names:
                continue
            if _NOT_CARRIED_FROM.get(klass) != name:
                names.append(name)
    return names


def _slots(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _slot_names(type(exc)):
        try:
            value = getattr(exc, name)
        except AttributeError:  # e.g. BlockingIOError.characters_written when never set
            continue
        # An unset slot reads None and stays unset: OSError's message shows a filename2 set to
        # None ("[Errno 2] ...: 'a' -> None").
        if value is not None:
            out[name] = value
    return out


def _rebuild(
    cls: type[BaseException], args: tuple, slots: dict[str, Any], attrs: dict[str, Any]
) -> BaseException:
    # BaseException.__new__ sets .args without running a user __init__ that may need other
    # arguments; the slots and the instance dict then restore every attribute __init__ had set.
    exc = cls.__new__(cls, *args)
    return _restore_state(exc, args, slots, attrs)


def _restore_state(
    exc: BaseException, args: tuple, slots: dict[str, Any], attrs: dict[str, Any]
) -> BaseException:
    exc.args = args
    for name, value in slots.items():
        try:
            setattr(exc, name, value)
        except (AttributeError, TypeError):  # read-only in this Python version
            continue
    exc.__dict__.update(attrs)
    return exc


class _Carrier:
    """Pickles as a call to ``_rebuild`` that yields the exception itself."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple:
        exc = self.exc
        return (_rebuild, (type(exc), exc.args, _slots(exc), dict(exc.__dict__)))


def _round_trip(obj: Any) -> bytes | None:
    """``obj`` pickled, if it also unpickles (proved here, where failing is cheap)."""
    try:
        data = pickle.dumps(obj)
        pickle.loads(data)
        return data
    except Exception:
        return None


def _kind(value: Any) -> str:
    cls = type(value)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


class _ShownAs(str):
    """An argument that did not pickle, standing in as its ``repr``: shown as that text, not
    as a quoted string, so the exception's message reads as it did in the worker."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{_kind(value)} object>"


def _picklable_values(values: dict[str, Any], left_out: list[str]) -> dict[str, Any]:
    kept = {}
    for name, value in values.items():
        if _round_trip(value) is None:
            left_out.append(f"attribute {name!r} ({_kind(value)})")
        else:
            kept[name] = value
    return kept


def _picklable_state(exc: BaseException) -> tuple[bytes | None, tuple[str, ...], bool]:
    """The exception's state pickled, less what does not pickle (NOTE [ Exceptions that do not
    pickle ]); the names of what was left out; whether every argument travelled."""
    args, slots, attrs = exc.args, _slots(exc), dict(exc.__dict__)
    whole = _round_trip((args, slots, attrs))
    if whole is not None:
        return whole, (), True
    left_out: list[str] = []
    kept_args = []
    for i, arg in enumerate(args):
        if _round_trip(arg) is None:
            kept_args.append(_ShownAs(_safe_repr(arg)))
            left_out.append(f"argument {i} ({_kind(arg)}, replaced by its repr)")
        else:
            kept_args.append(arg)
    construct = not left_out  # no stand-in arguments: the constructor may be called
    kept_slots = _picklable_values(slots, left_out)
    kept_attrs = _picklable_values(attrs, left_out)
    state = _round_trip((tuple(kept_args), kept_slots, kept_attrs))
    if state is None:  # the parts pickle one by one but not together: keep the message only
        state = _round_trip(((str(exc),), {}, {}))
        left_out, construct = ["its arguments and attributes (they do not pickle together)"], False
    return state, tuple(left_out), construct


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


def describe_failure(indices: Any, exc: BaseException) -> str:
    """What was being loaded when ``exc`` was raised: the sample index that raised first, then
    its batch (NOTE [ The sample that raised ] in ``stoker.fetch.fetchers``)."""
    index = failed_index(exc)
    if index is UNKNOWN or not isinstance(indices, list):
        return describe_indices(indices)
    if len(indices) == 1:
        return f"sample index {index!r}"
    return f"sample index {index!r} (its batch: {describe_indices(indices)})"


_CUDA_IN_WORKER = ("CUDA error: initialization error", "re-initialize CUDA in forked subprocess")
CUDA_HINT = (
    "stoker: this worker used CUDA (in __getitem__, collate_fn or worker_init_fn), which a "
    "worker process cannot do once the main process has initialised CUDA. Return CPU tensors "
    "from the dataset and move each batch to the GPU in the training loop "
    "(batch.to(device, non_blocking=True)), or start workers with "
    "multiprocessing_context='spawn'."
)


def _cuda_tensors_held() -> str:
    """The dataset's CUDA tensors, named for ``CUDA_HINT``: the likely cause."""
    info = get_worker_info()
    if info is None:
        return ""
    found = [path for path, value in iter_attributes(info.dataset)
             if isinstance(value, torch.Tensor) and value.device.type == "cuda"]
    if not found:
        return ""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (f" The dataset holds CUDA tensors: {found[0]}{more}; keep them on the CPU "
            f"({found[0]} = {found[0]}.cpu()).")


def capture(exc: BaseException, worker_id: int, doing: str) -> RemoteError:
    """Package ``exc`` (being handled now) for the trip to the main process.

    ``doing`` completes "while ...", e.g. ``"loading sample indices [3, 4]"``.
    """
    where = f"in DataLoader worker {worker_id} (pid {os.getpid()}) while {doing}"
    if any(marker in str(exc) for marker in _CUDA_IN_WORKER):
        add_note(exc, CUDA_HINT + _cuda_tensors_held())
    tb_text = "".join(traceback.format_exception(type(exc), exc, _from_torch(exc.__traceback__)))
    fields = (type(exc).__qualname__, tb_text, where, f"in DataLoader worker process {worker_id}")
    pickled_type = _round_trip(type(exc))
    if pickled_type is None:
        return RemoteError(None, None, None, *fields)
    whole = _round_trip(_Carrier(exc))
    if whole is not None:
        return RemoteError(whole, pickled_type, None, *fields)
    state, left_out, construct = _picklable_state(exc)  # NOTE [ Exceptions that do not pickle ]
    return RemoteError(None, pickled_type, state, *fields, left_out, construct)


def _loads(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # e.g. a class the worker defined after it started
        return None


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _from_torch(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from its first frame in torch's code (the worker loop's line that called the
    dataset) down: the frames torch's worker formats; all of ``tb`` where it has none."""
    entry = tb
    while entry is not None:
        if entry.tb_frame.f_code.co_filename.startswith(_TORCH_DIR):
            return entry
        entry = entry.tb_next
    return tb


def _as_torch_raises(cls: type[BaseException], err: RemoteError) -> BaseException:
    """What torch's own ``ExceptionWrapper.reraise`` raises for ``cls`` raised in the worker
    (NOTE [ A worker's exception has torch's type ])."""
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    wrapper.exc_type, wrapper.exc_msg, wrapper.where = cls, err.tb_text, err.torch_where
    try:
        wrapper.reraise()
    except BaseException as raised:  # noqa: BLE001 -- whatever torch raises is the answer
        return raised.with_traceback(None)
    raise AssertionError("torch's ExceptionWrapper.reraise returned without raising")


def _left_out_note(exc: BaseException, err: RemoteError, constructed: bool) -> str:
    name = type(exc).__name__
    how = (
        f"by calling {name}(*args), so it holds what that constructor sets"
        if constructed
        else "from what travelled"
    )
    return (
        f"stoker: {', '.join(err.left_out)} could not be pickled in the worker and did not "
        f"travel to the main process; the {name} was rebuilt here {how}. Keep picklable "
        "values on exceptions (a string, not a lock or a function) to get them back whole."
    )


def _from_parts(cls: type[BaseException], err: RemoteError) -> BaseException | None:
    """The exception rebuilt from its pickled state, or None when that cannot be done."""
    state = _loads(err.pickled_state)
    if state is None:
        return None
    args, slots, attrs = state
    if err.left_out:  # NOTE [ Exceptions that do not pickle ]
        exc = _constructed(cls, args) if err.construct else None
        if exc is not None:
            _restore_state(exc, args, slots, attrs)
            add_note(exc, _left_out_note(exc, err, constructed=True))
            return exc
    try:
        exc = _rebuild(cls, args, slots, attrs)
    except Exception:  # e.g. a __new__ that wants other arguments
        return None
    if err.left_out:
        add_note(exc, _left_out_note(exc, err, constructed=False))
    return exc


def _constructed(cls: type[BaseException], args: tuple) -> BaseException | None:
    try:
        return cls(*args)
    except Exception:  # a constructor that wants other arguments: rebuilt without it
        return None


def rebuild(err: RemoteError) -> BaseException:
    """The exception to raise in the main process, with the worker traceback chained."""
    exc = _loads(err.pickled)
    if exc is None:
        cls = _loads(err.pickled_type)
        if cls is None:
            return WorkerError(
                f"Caught {err.type_name} {err.where}, and it could not be sent to the main "
                "process (its class does not pickle: define it at the top level of an "
                f"importable module). The worker's traceback:\n{err.tb_text}"
            )
        exc = _from_parts(cls, err)
    torch_exc = _as_torch_raises(type(exc) if exc is not None else cls, err)
    if exc is None:  # its message holds the worker's traceback already
        add_note(torch_exc, f"stoker: raised {err.where}.")
        return torch_exc
    # stoker's own errors (MixedDeviceError...) stand for torch's error and subclass its type.
    if type(torch_exc) is type(exc) or type(exc).__module__.startswith("stoker."):
        add_note(exc, f"stoker: raised {err.where}; the worker's traceback is chained above.")
        exc.__cause__ = RemoteTraceback(err.tb_text)
        return exc
    # NOTE [ A worker's exception has torch's type ]
    add_note(exc, f"stoker: raised {err.where}; the worker's traceback is in the message below.")
    torch_exc.__cause__ = exc
    add_note(torch_exc, (
        f"stoker: the {type(exc).__name__} itself, with its arguments and attributes, is "
        f"chained above (this exception's __cause__); torch raises {type(torch_exc).__name__} "
        f"where a {type(exc).__name__} cannot be made from one message, and so does stoker."))
    return torch_exc
