"""Name what in a worker's spec cannot be pickled, in a note on the pickle error.

NOTE [ What spawn cannot send ]
Under the ``spawn`` and ``forkserver`` start methods a worker is a new Python process: it gets
the dataset, ``collate_fn`` and ``worker_init_fn`` by pickle (NOTE [ Pickle once ]), where a
forked worker inherits them. A lambda, a function or class defined inside a function, a lock
or an open file anywhere in them fails the start with pickle's error, which names the object
(``<function <lambda> at 0x...>``) but not where it is, under frames of stoker's. torch raises
the same error from ``Process.start`` (after a warning); stoker keeps its type and text, so
code catching it still does, and adds a note: which argument, or which attribute path of the
dataset (``dataset.transforms[1]``), why the start method needs it pickled, and what to change.

The path is found after the failure only: each part is pickled alone, and the search descends
into the first that fails, attribute by attribute (a list's or dict's items by bisection),
down to an object none of whose parts fails alone. The probes pickle into nothing: tensors and
storages are left out by ``persistent_id`` (torch's reductions would move them into shared
memory), large buffers stay out of band, and an fd a reducer asks to send is not duplicated.
"""

from __future__ import annotations

import functools
import pickle
import types
from collections.abc import Callable, Iterator
from multiprocessing import context as mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from stoker._core.notes import add_note
from stoker._core.specs import WorkerSpec
from stoker._core.walk import attributes

PICKLE_ERRORS = (TypeError, AttributeError, pickle.PicklingError)  # what torch's start catches
_MAX_DEPTH = 16
_LINEAR = 8  # up to this many parts are tried one by one; more are bisected


class _Sink:
    def write(self, data: Any) -> int:
        return len(data)


class _NoFds:
    """Stands in for the process being started: a reducer's fd is not duplicated."""

    class DupFd:
        def __init__(self, fd: int) -> None:
            self.fd = fd

    def duplicate_for_child(self, fd: int) -> int:
        return fd


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    return False  # out of band: not copied


class _Probe(pickle.Pickler):
    def __init__(self) -> None:
        super().__init__(_Sink(), protocol=5, buffer_callback=_out_of_band)
        table = dict(ForkingPickler(_Sink()).dispatch_table)  # torch's reducers included
        self.dispatch_table = table

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            return 0
        return None


def _error(obj: Any) -> BaseException | None:
    """The error pickling ``obj`` alone raises, or None."""
    previous = mp_context.get_spawning_popen()
    mp_context.set_spawning_popen(_NoFds())  # type: ignore[arg-type]
    try:
        _Probe().dump(obj)
    except RecursionError:
        return None
    except Exception as exc:
        return exc
    finally:
        mp_context.set_spawning_popen(previous)
    return None


def _parts(path: str, obj: Any) -> tuple[list[Any], Callable[[int], str]]:
    """What ``obj`` pickles (items, attributes, a partial's pieces), and the path of the k-th
    (made only for the one to blame: a list may be long)."""
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
        return [], str  # pickled by reference: it fails itself
    if isinstance(obj, (list, tuple)):
        return list(obj), lambda k: f"{path}[{k}]"
    if isinstance(obj, (set, frozenset)):
        return list(obj), lambda k: f"an item of {path}"
    if isinstance(obj, dict):
        named = [(f"[{key!r}]", value) for key, value in obj.items()]
    elif isinstance(obj, types.MethodType):
        named = [(".__self__", obj.__self__), (".__func__", obj.__func__)]
    elif isinstance(obj, functools.partial):
        named = [(".func", obj.func),
                 *((f".args[{i}]", a) for i, a in enumerate(obj.args)),
                 *((f".keywords[{k!r}]", v) for k, v in obj.keywords.items())]
    else:
        try:
            named = [(f".{name}", value) for name, value in attributes(obj).items()]
        except Exception:  # a property or __getattr__ that raises: nothing to descend into
            return [], str
    return [value for _, value in named], lambda k: path + named[k][0]


def _first_failing(values: list[Any], skip: set[int]) -> int | None:
    """The position of the first value that fails alone (not one of ``skip``, the objects
    on the path down); a long list is bisected: a slice of it fails iff one of its values
    does."""
    lo, hi = 0, len(values)
    while hi - lo > _LINEAR:
        mid = (lo + hi) // 2
        if _error([v for v in values[lo:mid] if id(v) not in skip]) is not None:
            hi = mid
        elif _error([v for v in values[mid:hi] if id(v) not in skip]) is not None:
            lo = mid
        else:
            return None  # only together (a memo or reducer quirk): stop at the parent
    for k in range(lo, hi):
        if id(values[k]) not in skip and _error(values[k]) is not None:
            return k
    return None


def _culprit(path: str, obj: Any) -> tuple[str, Any]:
    """The deepest part of ``obj`` (known to fail) that fails alone."""
    on_path = {id(obj)}
    for _ in range(_MAX_DEPTH):
        values, label = _parts(path, obj)
        k = _first_failing(values, on_path)
        if k is None:
            break
        path, obj = label(k), values[k]
        on_path.add(id(obj))
    return path, obj


def _spec_parts(spec: WorkerSpec) -> Iterator[tuple[str, Any]]:
    yield "dataset", spec.fetch.dataset
    yield "collate_fn", spec.fetch.collate_fn
    yield "worker_init_fn", spec.worker_init_fn


def _what(obj: Any) -> tuple[str, str]:
    """What ``obj`` is, and how to make it picklable."""
    local_fix = ("define it with `def` at the top level of a module the workers can import "
                 "(not inside a function, not a lambda)")
    if isinstance(obj, type):
        return (f"the class {obj.__module__}.{obj.__qualname__}",
                "define the class at the top level of a module the workers can import")
    if isinstance(obj, types.FunctionType):
        name, kind = obj.__qualname__, "function"
        if "<lambda>" in name:
            return "a lambda", local_fix
        if "<locals>" in name:
            return f"{name}, a {kind} defined inside a function", local_fix
        return f"the {kind} {obj.__module__}.{name}", local_fix
    cls = type(obj)
    if "<locals>" in cls.__qualname__:
        return (f"an instance of {cls.__qualname__}, a class defined inside a function",
                "define the class at the top level of a module the workers can import")
    name = cls.__qualname__
    if cls.__module__ != "builtins":
        name = f"{cls.__module__}.{name}"
    return (f"a {name} object",
            "create it in each worker instead (in worker_init_fn, or on first use in "
            "__getitem__), or leave it out of the pickle with __getstate__")


def explain(exc: BaseException, spec: WorkerSpec, method: str) -> None:
    """Add a note to ``exc`` (raised pickling ``spec`` to start a ``method`` worker) naming the
    part that cannot be pickled and the fix; nothing when no single part is to blame (or the
    search itself fails: the error is raised as it is)."""
    try:
        found = _find(spec)
    except Exception:
        return
    if found is not None:
        where, (what, fix) = found[0], _what(found[1])
        add_note(exc,
            f"stoker: with the {method!r} start method each worker is a new Python process, "
            "which receives the dataset, collate_fn and worker_init_fn by pickle; "
            f"{where} cannot be pickled: it is {what}. To fix it, {fix}; or pass "
            "multiprocessing_context='fork', whose workers inherit them instead."
        )


def _find(spec: WorkerSpec) -> tuple[str, Any] | None:
    for path, part in _spec_parts(spec):
        if _error(part) is not None:
            return _culprit(path, part)
    return None
