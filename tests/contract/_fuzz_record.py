"""Run one ``Case`` through a DataLoader class and record everything a user can observe.

``run_case(loader_cls, case)`` resets the main process's RNGs (torch, random, numpy), builds
the case's dataset, sampler, collate and worker_init_fn, constructs the loader, runs the
epochs (applying the reassignments between them), and returns a plain record of ints, strings,
tuples, lists and dicts, so that ``==`` compares two runs and ``describe_difference`` shows
where they part:

* construction: the exception (type, message) or none; ``len(loader)`` before (if asked) and
  after the epochs; the warnings issued in the main process, per phase, under the case's
  warning filters (``Case.warn``): category, text, the file and line they are attributed to
  (what ``filterwarnings(module=...)`` and the once-per-location registry go by), repeats;
  under ``error`` a warning is an exception, recorded where it stopped the run; exceptions
  that reached ``sys.unraisablehook`` or ``threading.excepthook`` (``_fuzz_env``); on a run
  that succeeds, what the main process wrote to stdout and stderr and logged at INFO and
  above;
* per epoch: each reassignment's outcome; every batch (container types, namedtuple and
  subclass types with their attributes, dtypes, shapes, strides, storage offsets and sizes,
  shared-memory flags, values; aliasing between the batch's array leaves and with the
  dataset's own arrays), received in order (sorted where torch's order depends on timing);
  the exceptions (type, attributes, message features) and how the epoch ended; whether held
  batches changed later; the main process's RNG draws after the epoch; its signal handlers
  and masks once the first batch is in (the workers run) and after the epoch;
* the log of side effects the main process saw, interleaved with the loop's progress
  (``len()``, ``__getitem__``/``__getitems__``/``__iter__`` calls, sampler steps, collate
  calls, each marked main thread or not).

Everything the user's code observed inside workers travels in the batches themselves (see
``_fuzz_cases``); ``_fuzz_plain`` makes batches and exceptions plain and renames process ids
``pid:main`` / ``pid:#k`` in order of appearance (``pid:?`` in the batches of an epoch whose
order is timing's, where which process comes first is timing's too).
"""

from __future__ import annotations

import contextlib
import difflib
import pprint
import random
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _fuzz_callables import FuzzCollate, FuzzWorkerInit, build_batch_sampler, build_sampler
from _fuzz_cases import Log, build_dataset
from _fuzz_env import (
    fresh_main_process,
    loud_failures,
    main_process_says,
    plain_warnings,
    process_counter,
    quiet_failures,
    signals,
    warning_filters,
)
from _fuzz_patches import patch
from _fuzz_plain import canonical_pids, drop_tracebacks, exc_record, mask_pids, plain_batch
from _fuzz_spec import (
    BatchSamplerSpec,
    Case,
    CollateSpec,
    EpochSpec,
    Op,
    SamplerSpec,
    WorkerInitSpec,
)
from _fuzz_torch_ds import write_tables

from _counting_modes import counting_mode

MAX_STEPS = 200  # next() calls per epoch before the record says "too many"


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
    if attr == "generator":  # the datasets' "lgen" draws from the loader's generator too
        generator = None if value is None else torch.Generator().manual_seed(value)
        progress["generator"] = generator  # type: ignore[assignment]
        return generator
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
        self.undo: list[Callable[[], None]] = []  # the patches of torch's code, undone last
        self.broken = False  # an epoch so far ended before its end (a break, an error)

    def build(self, value: Any, attr: str) -> Any:
        return build_value(value, attr, self.case.dataset.n, self.log, self.progress)

    def warnings_since(self) -> list[tuple]:
        new = self.caught[self.seen_warnings:]
        self.seen_warnings = len(self.caught)
        return plain_warnings(new)

    def run(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"ctor": None, "len_first": None, "epochs": [], "len_end": None}
        warn_always = torch.is_warn_always_enabled()
        torch.set_warn_always(True)  # torch's warn-once warnings: each run sees its own
        try:
            with fresh_main_process(self.case.started), loud_failures() as loud, \
                    main_process_says() as said:
                self._run(rec)
        finally:
            torch.set_warn_always(warn_always)
            while self.undo:
                self.undo.pop()()
        failed = any(rec.get(k) is not None for k in ("ctor", "build")) or any(
            e["errors"] for e in rec["epochs"])
        rec["loud"] = quiet_failures(loud, failed)
        rec["said"] = [] if failed else said  # louder than torch on a failure is fine
        rec["rng_end"] = main_rng()
        rec["log"] = list(self.log)
        return canonical_pids(rec)

    def _run(self, rec: dict[str, Any]) -> None:
        self.progress["process_base"] = process_counter()  # _fuzz_env's "proc" observation
        seed_main(self.case.main_seed)
        ds = build_dataset(self.case.dataset, self.log, self.progress)
        with warning_filters(self.case.warn) as caught:
            self.caught = caught
            try:  # the user's own objects may refuse the case (RandomSampler of nothing)
                kwargs = {name: self.build(value, name) for name, value in self.case.args}
            except Exception as exc:
                rec["build"] = exc_record(exc)
                drop_tracebacks(exc)
                return
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

    def apply(self, loader: Any, ds: Any, op: Op) -> Any:
        if op.attr == "write_tables":
            write_tables(ds)
            return (op.attr, "ok")
        if op.attr == "patch_torch":
            self.undo.append(patch(op.value))
            return (op.attr, op.value)
        if op.attr == "torch_mode":  # the epoch's iter() and next() calls run inside it
            return (op.attr, op.value)
        try:
            setattr(loader, op.attr, self.build(op.value, op.attr))
        except Exception as exc:
            record = exc_record(exc)
            record["message"] = str(exc)
            drop_tracebacks(exc)
            return (op.attr, record)
        return (op.attr, "ok")

    def epoch(self, loader: Any, ds: Any, number: int, spec: EpochSpec) -> dict[str, Any]:
        out: dict[str, Any] = {"ops": [self.apply(loader, ds, op) for op in spec.ops],
                               "main_signals": None}
        ds.tag = f"epoch{number}"
        self.log.add("loop", "iter", number)
        batches: list[Any] = []
        errors: list[Any] = []
        held: list[tuple[Any, Any]] = []
        end: Any = None
        kinds = [op.value for op in spec.ops if op.attr == "torch_mode"]
        mode = counting_mode(kinds[-1]) if kinds else None
        inside: Any = mode if mode is not None else contextlib.nullcontext()
        try:
            with inside:
                it = iter(loader)
        except Exception as exc:
            errors.append(("iter", exc_record(exc)))
            drop_tracebacks(exc)
            it, end = None, "iter failed"
        received = 0
        for _ in range(MAX_STEPS if it is not None else 0):
            try:
                with inside:
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
            if received == 1:  # the workers run: what the training loop's process is now
                out["main_signals"] = signals()
            if spec.stop_after is not None and received >= spec.stop_after:
                end = "break"
                break
        else:
            if it is not None:
                end = "too many batches"
        out["held_unchanged"] = [plain_batch(b, ds.tables) == p for b, p in held]
        del held, it
        out["main_signals_after"] = signals()
        self.log.add("loop", "epoch end", number)
        out["batches"] = _order_free(batches) if self.case.order_free else batches
        # What the mode saw, on a run that succeeds (louder than torch on a failure is fine)
        # and whose epochs all ran to their end: after a break, how many of the batches in
        # flight the loop's process received in this call or the next is timing's, torch's too.
        whole = isinstance(end, tuple) and end[0] == "stop" and not self.broken
        out["mode_seen"] = dict(mode.seen) if mode is not None and whole and not errors else None
        self.broken = self.broken or not whole
        out["errors"] = errors
        out["end"] = end
        out["warnings"] = self.warnings_since()
        out["rng"] = main_rng()
        return out


def _order_free(batches: list[Any]) -> list[Any]:
    """An epoch whose batch order is timing's (``Case.order_free``): its batches sorted, each
    process id in them written ``pid:?``. Which worker's batch arrives first is timing's too,
    so the processes cannot be named in order of appearance alike in both runs (two workers'
    batches that differ only by their pid sort either way); what each batch holds is still
    compared."""
    return sorted((mask_pids(b) for b in batches), key=repr)


def run_case(loader_cls: type, case: Case) -> dict[str, Any]:
    return _Run(loader_cls, case).run()


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


def compare_case(
    case: Case,
    settle: Callable[[], list[str]] | None = None,
    loader_cls: type | None = None,
) -> str | None:
    """Run ``case`` through torch and ``loader_cls`` (default ``stoker.DataLoader``); None
    when the records agree, else the differences.

    ``settle`` (optional) runs after each loader is gone and returns what it left behind
    (processes, threads, fds, shared memory); anything left fails the comparison.
    """
    if loader_cls is None:
        import stoker

        loader_cls = stoker.DataLoader
    expected = run_case(torch.utils.data.DataLoader, case)
    left_torch = settle() if settle else []
    actual = run_case(loader_cls, case)
    left_stoker = settle() if settle else []
    if left_torch or left_stoker:
        return f"left behind: torch {left_torch}, stoker {left_stoker}"
    if expected == actual:
        return None
    return describe_difference(expected, actual)
