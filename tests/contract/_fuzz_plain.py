"""Plain, comparable values of what a user can observe: batches, exceptions, process ids.

``plain_batch`` turns a batch into dicts, lists, tuples, strings and numbers: containers with
their types (namedtuple and subclass types, subclass attributes, key order), tensors and
arrays with dtype, shape, values and layout (strides, storage offset and size, shared memory,
numpy flags), and the aliasing between the batch's leaves (memory overlap, identity) and with
the dataset's own arrays. ``exc_record`` keeps an exception's type, attributes and the parts
of its message a user can match on. ``canonical_pids`` renames process ids by first
appearance, and drops object addresses from messages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _fuzz_known import masked

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    byte_bounds = np.byte_bounds

_USER_FRAME = re.compile(r'File "[^"]*_fuzz_\w+\.py", line \d+, in (\w+)')


# --------------------------------------------------------------------------------------------
# Plain values
# --------------------------------------------------------------------------------------------


def _values(value: Any) -> Any:
    if isinstance(value, list):
        return [_values(v) for v in value]
    if isinstance(value, (float, complex)):
        return repr(value)
    return value


class _Plain:
    """Converts one batch; collects its array leaves for the aliasing check."""

    def __init__(self) -> None:
        self.arrays: list[Any] = []
        self.objects: list[Any] = []  # mutable objects, for identity between them

    def conv(self, x: Any) -> Any:
        if not isinstance(x, (str, bytes, int, float, complex, tuple, np.generic)) and (
            x is not None
        ):
            self.objects.append(x)
        if isinstance(x, torch.Tensor):
            self.arrays.append(x)
            layout = {"stride": tuple(x.stride()), "storage_offset": x.storage_offset(),
                      "storage_nbytes": x.untyped_storage().nbytes(), "is_shared": x.is_shared(),
                      "requires_grad": x.requires_grad, "device": x.device.type,
                      # torch's rebuild and collate leave their marks on the version counter
                      "version": None if x.is_inference() else x._version}
            return {"tensor": str(x.dtype), "shape": tuple(x.shape), "leaf": len(self.arrays) - 1,
                    "values": _values(x.tolist()), "layout": layout}
        if isinstance(x, np.ndarray):
            self.arrays.append(x)
            flags = {"strides": x.strides, "writeable": x.flags.writeable,
                     "owndata": x.flags.owndata, "c_contiguous": x.flags.c_contiguous}
            return {"ndarray": str(x.dtype), "shape": x.shape, "leaf": len(self.arrays) - 1,
                    "values": _values(x.tolist()), "flags": flags}
        if isinstance(x, np.generic):
            return {"npscalar": str(x.dtype), "value": _values(x.item())}
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return {"namedtuple": type(x).__qualname__,
                    "fields": {f: self.conv(v) for f, v in zip(x._fields, x, strict=True)}}
        if isinstance(x, dict):
            keys = [self.conv(k) for k in x]
            values = {repr(k): self.conv(v) for k, v in x.items()}
            return {"type": type(x).__qualname__, "keys": keys, "values": values,
                    "attrs": _attrs(x)}
        if isinstance(x, (list, tuple)):
            return {"type": type(x).__qualname__, "items": [self.conv(v) for v in x],
                    "attrs": _attrs(x)}
        if x is None or isinstance(x, (bool, int, str, bytes)):
            return (type(x).__qualname__, x)
        if isinstance(x, (float, complex)):
            return (type(x).__qualname__, repr(x))
        return (type(x).__qualname__, _attrs(x))


def _attrs(x: Any) -> Any:
    attrs = getattr(x, "__dict__", None)
    if not attrs:
        return None
    return sorted((k, _plain_attr(v)) for k, v in attrs.items())


def _plain_attr(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return repr(v)
    return f"<{type(v).__qualname__}>"


def _bounds(x: Any) -> tuple[int, int, int] | None:
    """(low, high, start) byte addresses of an array leaf; None when it has no elements."""
    if isinstance(x, torch.Tensor):
        if x.numel() == 0:
            return None
        start = x.data_ptr()
        span = sum((s - 1) * abs(st) for s, st in zip(x.shape, x.stride(), strict=True)) + 1
        return start, start + span * x.element_size(), start
    if x.size == 0:
        return None
    low, high = byte_bounds(x)
    return low, high, x.__array_interface__["data"][0]


def _aliasing(arrays: list[Any], tables: dict[int, Any]) -> list[tuple]:
    """Pairs of leaves whose memory overlaps, with their offset; and overlaps with the
    dataset's own arrays (a batch that is a view of the dataset)."""
    bounds = [_bounds(a) for a in arrays]
    out: list[tuple] = []
    for i, bi in enumerate(bounds):
        if bi is None:
            continue
        for j in range(i + 1, len(bounds)):
            bj = bounds[j]
            if bj is not None and bi[0] < bj[1] and bj[0] < bi[1]:
                out.append(("leaves", i, j, bj[2] - bi[2]))
        for number, table in sorted(tables.items()):
            bt = _bounds(table)
            if bt is not None and bi[0] < bt[1] and bt[0] < bi[1]:
                out.append(("dataset", i, number, bi[2] - bt[2]))
    return out


def _identical(objects: list[Any]) -> list[tuple]:
    """Pairs of places in a batch holding the very same object (``a is b``)."""
    first: dict[int, int] = {}
    out: list[tuple] = []
    for k, x in enumerate(objects):
        if id(x) in first:
            out.append(("same object", first[id(x)], k, type(x).__qualname__))
        else:
            first[id(x)] = k
    return out


def plain_batch(batch: Any, tables: dict[int, Any]) -> dict[str, Any]:
    conv = _Plain()
    value = conv.conv(batch)
    return {"batch": value,
            "aliasing": _aliasing(conv.arrays, tables) + _identical(conv.objects)}


_TORCH_WORKER_HEADER = re.compile(r"^Caught (\w+) in DataLoader worker process (\d+)\.$")
_STOKER_WORKER_NOTE = re.compile(r"raised in DataLoader worker (\d+) ")


def _worker_exception(exc: BaseException, lines: list[str]) -> dict[str, Any] | None:
    """While ``worker_exceptions`` is a known difference: what torch's rebuilt exception and
    stoker's original one still have in common (the original type's name, its message, the
    worker id), for an exception raised in a worker; None for any other exception."""
    # The type raised is compared whole: it decides which except clause catches the error
    # (NOTE [ A worker's exception has torch's type ]).
    raised = f"{type(exc).__module__}.{type(exc).__qualname__}"
    header = _TORCH_WORKER_HEADER.match(lines[0]) if lines else None
    if header is not None:  # torch: the original's "module.Type: message" is the last line
        message = lines[-1].split(": ", 1)[1] if ": " in lines[-1] else ""
        return {"in_worker": int(header.group(2)), "original_type": header.group(1),
                "original_message": message, "type": raised}
    if type(exc.__cause__).__name__ == "RemoteTraceback":  # stoker: the original
        notes = " ".join(getattr(exc, "__notes__", []))
        worker = _STOKER_WORKER_NOTE.search(notes)
        return {"in_worker": int(worker.group(1)) if worker else None,
                "original_type": type(exc).__name__,
                "original_message": lines[-1] if lines else "", "type": raised}
    return None


def exc_record(exc: BaseException) -> dict[str, Any]:
    """What a user can read off an exception: type, attributes, message features."""
    msg = str(exc)
    lines = msg.splitlines()
    if masked("worker_exceptions"):
        common = _worker_exception(exc, lines)
        if common is not None:
            return common
    attrs = {k: _plain_attr(v) for k, v in sorted(vars(exc).items())}
    if masked("exception_notes"):
        attrs.pop("__notes__", None)
    cause = exc.__cause__
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "first_line": lines[0] if lines else "",
        "last_line": lines[-1] if lines else "",
        "original_traceback": "Original Traceback (most recent call last)" in msg,
        "user_frames": _USER_FRAME.findall(msg),
        "attrs": attrs,
        "args": [type(a).__qualname__ for a in exc.args],
        "cause": None if cause is None else type(cause).__qualname__,
        "suppress_context": exc.__suppress_context__,
    }


def drop_tracebacks(exc: BaseException | None, seen: set[int] | None = None) -> None:
    """Break the exception -> traceback -> frame -> iterator cycle (see tests/integration)."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    exc.__traceback__ = None
    drop_tracebacks(exc.__cause__, seen)
    drop_tracebacks(exc.__context__, seen)


_PID = re.compile(r"^pid:(\d+)$")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _map_strings(record: Any, on_str: Callable[[str], str]) -> Any:
    """``record`` (lists, tuples, dicts, leaves) with each string ``s`` replaced by
    ``on_str(s)``, in order of appearance."""
    if isinstance(record, str):
        return on_str(record)
    if isinstance(record, list):
        return [_map_strings(v, on_str) for v in record]
    if isinstance(record, tuple):
        return tuple(_map_strings(v, on_str) for v in record)
    if isinstance(record, dict):
        return {k: _map_strings(v, on_str) for k, v in record.items()}
    return record


def mask_pids(record: Any) -> Any:
    """``record`` with every ``pid:<n>`` string written ``pid:?``."""
    return _map_strings(record, lambda s: "pid:?" if _PID.match(s) else s)


def canonical_pids(record: Any) -> Any:
    """Rename ``pid:<n>`` strings: ``pid:main`` for this process, ``pid:#k`` for the k-th
    other process seen (so that which samples came from the same process stays visible);
    drop object addresses (`` at 0x7f...``) from messages."""
    names: dict[str, str] = {str(os.getpid()): "pid:main"}

    def rename(s: str) -> str:
        m = _PID.match(s)
        if m is None:
            return _ADDRESS.sub(" at 0x?", s)  # object reprs in messages
        return names.setdefault(m.group(1), f"pid:#{len(names)}")

    return _map_strings(record, rename)
