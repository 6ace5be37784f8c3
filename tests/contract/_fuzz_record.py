"""Run one ``Case`` through a DataLoader class and record everything a user can observe.

``run_case(loader_cls, case)`` resets the main process's RNGs (torch, random, numpy), builds
the case's dataset, sampler, collate and worker_init_fn, constructs the loader, runs the
epochs (applying the reassignments between them), and returns a plain record of ints, strings,
tuples, lists and dicts, so that ``==`` compares two runs and ``describe_difference`` shows
where they part:

* construction: the exception (type, message) or none; ``len(loader)`` before (if asked) and
  after the epochs; the warnings raised in the main process, per phase;
* per epoch: each reassignment's outcome; every batch (container types, namedtuple and
  subclass types with their attributes, dtypes, shapes, strides, storage offsets and sizes,
  shared-memory flags, values; aliasing between the batch's array leaves and with the
  dataset's own arrays), received in order (sorted where torch's order depends on timing);
  the exceptions (type, attributes, message features) and how the epoch ended; whether held
  batches changed later; the main process's RNG draws after the epoch;
* the log of side effects the main process saw, interleaved with the loop's progress
  (``len()``, ``__getitem__``/``__getitems__``/``__iter__`` calls, sampler steps, collate
  calls, each marked main thread or not).

Everything the user's code observed inside workers travels in the batches themselves (see
``_fuzz_cases``). Process ids are renamed ``pid:main`` / ``pid:#k`` in order of appearance.
"""

from __future__ import annotations

import difflib
import os
import pprint
import random
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _fuzz_cases import (
    FuzzCollate,
    FuzzWorkerInit,
    Log,
    build_batch_sampler,
    build_dataset,
    build_sampler,
)
from _fuzz_known import masked
from _fuzz_spec import (
    BatchSamplerSpec,
    Case,
    CollateSpec,
    EpochSpec,
    Op,
    SamplerSpec,
    WorkerInitSpec,
)

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    byte_bounds = np.byte_bounds

MAX_STEPS = 200  # next() calls per epoch before the record says "too many"
_USER_FRAME = re.compile(r'File "[^"]*_fuzz_cases\.py", line \d+, in (\w+)')


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
                      "requires_grad": x.requires_grad, "device": x.device.type}
            if masked("is_shared"):
                del layout["is_shared"]
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
    header = _TORCH_WORKER_HEADER.match(lines[0]) if lines else None
    if header is not None:  # torch: the original's "module.Type: message" is the last line
        message = lines[-1].split(": ", 1)[1] if ": " in lines[-1] else ""
        return {"in_worker": int(header.group(2)), "original_type": header.group(1),
                "original_message": message}
    if type(exc.__cause__).__name__ == "RemoteTraceback":  # stoker: the original
        notes = " ".join(getattr(exc, "__notes__", []))
        worker = _STOKER_WORKER_NOTE.search(notes)
        return {"in_worker": int(worker.group(1)) if worker else None,
                "original_type": type(exc).__name__,
                "original_message": lines[-1] if lines else ""}
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


# --------------------------------------------------------------------------------------------
# Building and running
# --------------------------------------------------------------------------------------------


def seed_main(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def main_rng() -> tuple:
    """Draws from the main process's RNG streams (what a training loop would draw next)."""
    return (
        [repr(v) for v in torch.rand(2).tolist()],
        repr(random.random()),
        repr(float(np.random.rand())),
        torch.initial_seed(),
    )


def build_value(value: Any, attr: str, n: int, log: Log, progress: dict[str, int]) -> Any:
    if isinstance(value, SamplerSpec):
        return build_sampler(value, n, log, progress)
    if isinstance(value, BatchSamplerSpec):
        return build_batch_sampler(value, n, log, progress)
    if isinstance(value, CollateSpec):
        return FuzzCollate(value, log)
    if isinstance(value, WorkerInitSpec):
        return FuzzWorkerInit(value)
    if attr == "generator" and value is not None:
        return torch.Generator().manual_seed(value)
    return value


def _length(loader: Any) -> Any:
    try:
        return len(loader)
    except Exception as exc:
        record = exc_record(exc)
        drop_tracebacks(exc)
        return record


class _Run:
    def __init__(self, loader_cls: type, case: Case) -> None:
        self.loader_cls, self.case = loader_cls, case
        self.log = Log()
        self.progress = {"received": 0}
        self.caught: list[warnings.WarningMessage] = []
        self.seen_warnings = 0

    def build(self, value: Any, attr: str) -> Any:
        return build_value(value, attr, self.case.dataset.n, self.log, self.progress)

    def warnings_since(self) -> list[tuple[str, str]]:
        new = self.caught[self.seen_warnings:]
        self.seen_warnings = len(self.caught)
        return [(w.category.__qualname__, str(w.message)) for w in new]

    def run(self) -> dict[str, Any]:
        seed_main(self.case.main_seed)
        ds = build_dataset(self.case.dataset, self.log, self.progress)
        rec: dict[str, Any] = {"ctor": None, "len_first": None, "epochs": [], "len_end": None}
        warn_always = torch.is_warn_always_enabled()
        torch.set_warn_always(True)  # torch's warn-once warnings: each run sees its own
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.caught = caught
            try:  # the user's own objects may refuse the case (RandomSampler of nothing)
                kwargs = {name: self.build(value, name) for name, value in self.case.args}
            except Exception as exc:
                rec["build"] = exc_record(exc)
                drop_tracebacks(exc)
                return rec
            try:
                loader = self.loader_cls(ds, **kwargs)
            except Exception as exc:
                rec["ctor"] = exc_record(exc)
                rec["ctor"]["message"] = str(exc)
                drop_tracebacks(exc)
                loader = None
            rec["ctor_warnings"] = self.warnings_since()
            if loader is not None:
                ds.tag = "ctor"
                self.log.add("loop", "constructed")
                if self.case.len_first:
                    rec["len_first"] = _length(loader)
                for number, epoch in enumerate(self.case.epochs):
                    rec["epochs"].append(self.epoch(loader, ds, number, epoch))
                rec["len_end"] = _length(loader)
                del loader
            rec["end_warnings"] = self.warnings_since()
        torch.set_warn_always(warn_always)
        rec["rng_end"] = main_rng()
        rec["log"] = list(self.log)
        return canonical_pids(rec)

    def apply(self, loader: Any, op: Op) -> Any:
        try:
            setattr(loader, op.attr, self.build(op.value, op.attr))
        except Exception as exc:
            record = exc_record(exc)
            record["message"] = str(exc)
            drop_tracebacks(exc)
            return (op.attr, record)
        return (op.attr, "ok")

    def epoch(self, loader: Any, ds: Any, number: int, spec: EpochSpec) -> dict[str, Any]:
        out: dict[str, Any] = {"ops": [self.apply(loader, op) for op in spec.ops]}
        ds.tag = f"epoch{number}"
        self.log.add("loop", "iter", number)
        batches: list[Any] = []
        errors: list[Any] = []
        held: list[tuple[Any, Any]] = []
        end: Any = None
        try:
            it = iter(loader)
        except Exception as exc:
            errors.append(("iter", exc_record(exc)))
            drop_tracebacks(exc)
            it, end = None, "iter failed"
        received = 0
        for _ in range(MAX_STEPS if it is not None else 0):
            try:
                batch = next(it)
            except StopIteration as exc:
                end = ("stop", exc_record(exc))
                break
            except Exception as exc:
                errors.append((received, exc_record(exc)))
                drop_tracebacks(exc)
                self.log.add("loop", "error", received)
                if not spec.continue_on_error or len(errors) >= 2:
                    end = "error"
                    break
                continue
            self.progress["received"] += 1
            self.log.add("loop", "got", received)
            plain = plain_batch(batch, ds.tables)
            batches.append(plain)
            if spec.hold:
                held.append((batch, plain))
            del batch
            received += 1
            if spec.stop_after is not None and received >= spec.stop_after:
                end = "break"
                break
        else:
            if it is not None:
                end = "too many batches"
        out["held_unchanged"] = [plain_batch(b, ds.tables) == p for b, p in held]
        del held, it
        self.log.add("loop", "epoch end", number)
        out["batches"] = sorted(batches, key=repr) if self.case.order_free else batches
        out["errors"] = errors
        out["end"] = end
        out["warnings"] = self.warnings_since()
        out["rng"] = main_rng()
        return out


def run_case(loader_cls: type, case: Case) -> dict[str, Any]:
    return _Run(loader_cls, case).run()


_PID = re.compile(r"^pid:(\d+)$")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def canonical_pids(record: Any) -> Any:
    """Rename ``pid:<n>`` strings: ``pid:main`` for this process, ``pid:#k`` for the k-th
    other process seen (so that which samples came from the same process stays visible);
    drop object addresses (`` at 0x7f...``) from messages."""
    names: dict[str, str] = {str(os.getpid()): "pid:main"}

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            m = _PID.match(x)
            if m is None:
                return _ADDRESS.sub(" at 0x?", x)  # object reprs in messages
            return names.setdefault(m.group(1), f"pid:#{len(names)}")
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple):
            return tuple(walk(v) for v in x)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    return walk(record)


# --------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every place where ``a`` (torch's record) and ``b`` (stoker's) differ, as paths."""
    if type(a) is not type(b):
        return [f"{path}: {a!r:.200} (torch) != {b!r:.200} (stoker)"]
    if isinstance(a, dict):
        out: list[str] = []
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                out.append(f"{path}[{key!r}] only in {'torch' if key in a else 'stoker'}")
            else:
                out.extend(differences(a[key], b[key], f"{path}[{key!r}]"))
        return out
    if isinstance(a, (list, tuple)):
        if len(a) == len(b):
            return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in
                    differences(x, y, f"{path}[{i}]")]
        # Different lengths: align them (an extra log event shows as one insertion).
        out = [f"{path}: length {len(a)} (torch) != {len(b)} (stoker)"]
        matcher = difflib.SequenceMatcher(None, [repr(x) for x in a], [repr(y) for y in b],
                                          autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            if tag == "replace" and i2 - i1 == j2 - j1:
                for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                    out.extend(differences(a[i], b[j], f"{path}[{i}]"))
                continue
            out.append(f"{path}[{i1}:{i2}] (torch) {a[i1:i2]!r:.200} -> [{j1}:{j2}] "
                       f"(stoker) {b[j1:j2]!r:.200}")
        return out
    return [] if a == b else [f"{path}: {a!r:.200} (torch) != {b!r:.200} (stoker)"]


def describe_difference(expected: Any, actual: Any, limit: int = 40) -> str:
    """The differing paths (first ``limit``), then a unified diff of the two records."""
    found = differences(expected, actual)
    kinds = sorted({re.sub(r"\[\d+(:\d+)?\]", "[*]", f.split(" ")[0].rstrip(":"))
                    for f in found})
    head = [f"{len(found)} difference(s), at {len(kinds)} kind(s) of place:"]
    head += [f"  {k}" for k in kinds[:limit]]
    head += ["first ones:"] + [f"  {f}" for f in found[:limit]]
    diff = list(difflib.unified_diff(
        pprint.pformat(expected, width=110).splitlines(),
        pprint.pformat(actual, width=110).splitlines(),
        "torch.utils.data.DataLoader",
        "stoker.DataLoader",
        lineterm="",
        n=2,
    ))
    more = [f"... ({len(diff) - 3 * limit} more diff lines)"] if len(diff) > 3 * limit else []
    return "\n".join(head + diff[: 3 * limit] + more)


def compare_case(case: Case, settle: Callable[[], list[str]] | None = None) -> str | None:
    """Run ``case`` through torch and stoker; None when the records agree, else the diff.

    ``settle`` (optional) runs after each loader is gone and returns what it left behind
    (processes, threads, fds, shared memory); anything left fails the comparison.
    """
    import stoker

    expected = run_case(torch.utils.data.DataLoader, case)
    left_torch = settle() if settle else []
    actual = run_case(stoker.DataLoader, case)
    left_stoker = settle() if settle else []
    if left_torch or left_stoker:
        return f"left behind: torch {left_torch}, stoker {left_stoker}"
    if expected == actual:
        return None
    return describe_difference(expected, actual)
