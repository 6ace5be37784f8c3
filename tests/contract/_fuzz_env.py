"""The process a dataset runs in, and what the loader says: the fuzzer's two process axes.

**What the dataset sees of its process** (``observe``, called by ``_fuzz_cases`` from inside
``__getitem__`` / ``__iter__``, in a worker or in the main process). stoker promises the
process torch's ``_worker_loop`` gives (DESIGN 1.4; NOTE [ The worker's process is torch's ] in
``stoker/workers/entry.py``), so each of these is compared with torch's. The same in every
worker of an epoch:

* ``sig``: the Python-level handlers of ``SIGNALS`` by name; the calling thread's SigIgn,
  SigBlk and SigCgt masks from ``/proc/thread-self/status`` (SigCgt shows C-level handlers
  too: torch's worker handlers, faulthandler's; SigBlk is per thread, hence ``thread-self``).
* ``names``: ``/proc/self/comm`` and ``/proc/thread-self/comm`` (torch names its worker's
  thread ``pt_data_worker``), the thread's name, whether the process is a daemon, its
  parent's name, and in a worker the names of its threads (``QueueFeederThread`` once it has
  sent a result: the same in every worker at the same point).
* ``rt``: the collector (frozen objects, enabled, thresholds), ``faulthandler.is_enabled()``,
  ``sys.argv``, ``torch.get_num_threads()``, the names of the environment variables that
  differ from the main process's when the dataset was built, the RLIMIT_NOFILE/RLIMIT_CORE
  limits, OpenCV's thread count (cv2 is imported here, when installed, so that this does not
  depend on which tests ran before), the actions of the first warning filters, where fds 0-2
  lead and the types of ``sys.stdin/stdout/stderr`` (what becomes of a print or a warning).
* ``child`` (drawn for about one case in twenty: it starts a process per sample): SigIgn and
  SigBlk of ``cat /proc/self/status`` started with ``subprocess.run``, i.e. what a program the
  dataset execs inherits (an ignored SIGINT survives ``exec``; a caught one does not).

Different from worker to worker:

* ``proc``: ``multiprocessing.current_process().name`` with its number made relative:
  ``Process-N`` is recorded as ``Process+k``, k = N minus ``multiprocessing``'s process counter
  read when the run started (``process_counter``). stoker and torch run in one process, so
  the absolute N differs between the runs; relative to the run's start it still shows every
  ``Process`` object the loader made, in order, which names in order of appearance (as
  ``_fuzz_plain`` does for pids) would hide.
* ``info``: ``type(get_worker_info())``, its dataclass fields, its ``repr`` with the dataset's
  own repr replaced by ``<dataset>``.
* ``gen``: a draw from the ``np.random.default_rng(0)`` the dataset holds
  (``DatasetSpec.gen``): each worker draws from its own copy, under torch as under stoker.

Masks and lists are strings (``"SIGINT,SIGTERM"``), so that ``default_collate`` keeps them
as they are.

**What the loader says** (``warning_filters``, ``plain_warnings``, ``loud_failures``): each
case runs under one of ``WARN_MODES``: ``record`` (every warning recorded: category, text,
the file it is attributed to made relative (``canonical_path``) and its line, with a count of
repeats); ``error`` (``simplefilter("error")``: a warning is an exception where it is issued;
the record shows where the run stopped and the exception); ``ignore_torch``
(``filterwarnings("ignore", module="torch")``, the rest recorded: a warning attributed to
another module than torch's passes); ``default`` (Python's default action: once per
location, which each module's ``__warningregistry__`` remembers: a warning attributed to
torch's line is not shown again from there in the same run, whoever issued it; each run
starts afresh, as ``catch_warnings`` clears the registries). Exceptions nothing can catch
(``sys.unraisablehook``, ``threading.excepthook``: "Exception ignored in ..." on stderr) are
recorded in every mode. ``main_process_says`` records what the main process writes to
``sys.stdout`` and ``sys.stderr`` and every ``logging`` record at INFO and above (a program
that configured nothing sees WARNING and above on stderr, through ``logging.lastResort``; one
that called ``logging.basicConfig(level=logging.INFO)`` sees INFO too): on a run that
succeeds, stoker's must be torch's (nothing; NOTE [ Advice is quiet ]).

``fresh_main_process`` starts each run where a fresh process would be for what torch's
loader changes once per process (its SIGCHLD handler in the main process), and as the case
says the script was started (``Case.started``: from a terminal, or in the background with
SIGINT, SIGQUIT and SIGHUP ignored, which workers and their children inherit); the test module
also turns ``faulthandler`` off while the cases run, as in a plain ``python train.py``
(pytest turns it on), so that what workers inherit is a script's.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import io
import logging
import multiprocessing
import os
import re
import resource
import signal
import site
import subprocess
import sys
import sysconfig
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Any

import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import signal_handling

try:  # imported here, so that the cv2 observation does not depend on the tests run before
    import cv2  # noqa: F401
except ImportError:  # pragma: no cover - opencv is a dev dependency
    pass

SIGNALS = ("SIGINT", "SIGTERM", "SIGCHLD", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGHUP", "SIGQUIT")
# How the main process was started (``Case.started``): what it ignores from the start.
STARTED = {"terminal": (), "background": ("SIGINT", "SIGQUIT", "SIGHUP")}  # nohup cmd &
OBS_ENV = ("sig", "names", "rt", "proc", "info", "gen", "child")
WARN_MODES = ("record", "error", "ignore_torch", "default")
CHILD_TIMEOUT_S = 30

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ROOTS = sorted(
    {p for p in [*site.getsitepackages(), site.getusersitepackages()] if p}, key=len,
    reverse=True,
)
_STDLIB = sysconfig.get_paths()["stdlib"]


# --------------------------------------------------------------------------------------------
# Inside the dataset
# --------------------------------------------------------------------------------------------


def handler_name(handler: Any) -> str:
    """``signal.getsignal``'s answer by name: SIG_DFL, SIG_IGN, default_int_handler, None (a
    handler set outside Python), or the handler's module and qualified name."""
    if handler is None:
        return "None"
    if handler is signal.SIG_DFL:
        return "SIG_DFL"
    if handler is signal.SIG_IGN:
        return "SIG_IGN"
    if handler is signal.default_int_handler:
        return "default_int_handler"
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', '?')}"


def _signal_name(number: int) -> str:
    if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
        return f"SIGRTMIN+{number - signal.SIGRTMIN}"
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def mask_names(hex_mask: str) -> str:
    """A /proc status mask (hex, bit k is signal k + 1) as signal names."""
    bits = int(hex_mask, 16)
    return ",".join(_signal_name(k + 1) for k in range(bits.bit_length()) if bits >> k & 1)


def status_masks(text: str, keys: tuple[str, ...] = ("SigIgn", "SigBlk", "SigCgt")) -> dict:
    fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    return {key: mask_names(fields[key].strip()) for key in keys}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _type_name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _cv2_threads() -> int | str:
    cv2 = sys.modules.get("cv2")
    return "not loaded" if cv2 is None else int(cv2.getNumThreads())


def process_counter() -> int:
    """The N the next ``multiprocessing.Process`` will be named ``Process-N`` with (read
    without taking it)."""
    counter = multiprocessing.process._process_counter  # type: ignore[attr-defined]
    return int(re.fullmatch(r"count\((\d+)\)", repr(counter)).group(1))  # type: ignore[union-attr]


def signals() -> dict[str, str]:
    """The Python-level handlers of ``SIGNALS`` and the calling thread's masks: the ``sig``
    observation, and the main process's in the record (``_fuzz_record``)."""
    masks = status_masks(_read("/proc/thread-self/status"))
    return {
        **{name: handler_name(signal.getsignal(getattr(signal, name))) for name in SIGNALS},
        **masks,
    }


def _names() -> dict[str, Any]:
    parent = multiprocessing.parent_process()
    return {
        "comm": _read("/proc/self/comm"),
        "thread_comm": _read("/proc/thread-self/comm"),
        "thread": threading.current_thread().name,
        "daemon": bool(multiprocessing.current_process().daemon),
        "parent": "none" if parent is None else parent.name,
        # a worker's threads: torch's result queue's feeder once it has put (NOTE [ torch's
        # feeder thread in a worker ]), but not the resource sharer's "Thread-N (_serve)",
        # which torch's feeder starts while the worker fetches on (a race: NOTE [ torch's
        # resource sharer in a worker ]); not in the main process, where the other loader's
        # threads may still be ending
        "threads": ",".join(sorted(t.name for t in threading.enumerate()
                                   if not t.name.endswith(" (_serve)")))
        if get_worker_info() is not None else "main process",
    }


def stdio_targets() -> tuple[str, ...]:
    """Where fds 0, 1 and 2 lead (``readlink``), or ``closed``."""
    out = []
    for fd in (0, 1, 2):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            out.append("closed")
    return tuple(out)


def _stdio(parent: tuple[str, ...]) -> str:
    """fds 0-2 against the main process's when the dataset was built (``same``, or the kind
    of what they lead to now), and the types of ``sys.stdin/stdout/stderr``: a loader that
    sent a worker's output elsewhere would hide the user's prints and warnings."""
    fds = [
        "same" if now == before else re.sub(r"\[\d+\]|:\d+$", "", now)
        for now, before in zip(stdio_targets(), parent, strict=True)
    ]
    streams = [type(s).__qualname__ for s in (sys.stdin, sys.stdout, sys.stderr)]
    return f"fds={','.join(fds)} streams={','.join(streams)}"


def _runtime(parent_env: dict[str, str], parent_stdio: tuple[str, ...]) -> dict[str, Any]:
    here = dict(os.environ)
    changed = sorted(k for k in set(here) | set(parent_env) if here.get(k) != parent_env.get(k))
    out = {
        # Not gc.get_freeze_count(): the test process froze its collected objects
        # (tests/_collected_frozen.py), which makes the count the same under both loaders and
        # a walk of ~10^6 objects per call. A fresh interpreter's probe compares it
        # (tests/integration/_process_probe.py, "gc_frozen" in the workers and the main process).
        "gc": f"enabled={gc.isenabled()} threshold={gc.get_threshold()}",
        "faulthandler": faulthandler.is_enabled(),
        "argv": repr(sys.argv),
        "torch_threads": torch.get_num_threads(),
        "env_changed": ",".join(changed),
        "rlimits": repr((resource.getrlimit(resource.RLIMIT_NOFILE),
                         resource.getrlimit(resource.RLIMIT_CORE))),
        "cv2_threads": _cv2_threads(),
        "warning_filters": ",".join(f[0] for f in warnings.filters[:3]),
        "stdio": _stdio(parent_stdio),
    }
    return out


def _process_name(process_base: int) -> str:
    name = multiprocessing.current_process().name
    numbered = re.fullmatch(r"(\w+)-(\d+)", name)  # Process-N, ForkProcess-N, ...
    if numbered is None:
        return name
    return f"{numbered.group(1)}{int(numbered.group(2)) - process_base:+d}"


def _worker_info() -> dict[str, str]:
    info = get_worker_info()
    text = repr(info)
    if info is not None:
        text = text.replace(repr(info.dataset), "<dataset>")
    return {
        "type": _type_name(info),
        "fields": ",".join(f.name for f in dataclasses.fields(info))
        if dataclasses.is_dataclass(info) else "not a dataclass",
        "repr": re.sub(r" at 0x[0-9a-f]+", "", text),
    }


def _child() -> str:
    """SigIgn and SigBlk of a program this process starts: ``cat`` reads its own status.
    (Not ``sys.executable``: a Python child ignores SIGPIPE and SIGXFSZ itself as it starts,
    and starts ten times slower.)"""
    done = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, check=True)
    masks = status_masks(done.stdout, ("SigIgn", "SigBlk"))
    return f"ign={masks['SigIgn']} blk={masks['SigBlk']}"


def observe(name: str, dataset: Any) -> Any:
    """The ``name`` observation (one of ``OBS_ENV``) made by ``dataset``'s code."""
    if name == "sig":
        return signals()
    if name == "names":
        return _names()
    if name == "rt":
        return _runtime(dataset.parent_env, dataset.parent_stdio)
    if name == "proc":
        return _process_name(dataset.progress["process_base"])
    if name == "info":
        return _worker_info()
    if name == "gen":
        return "none" if dataset.gen is None else int(dataset.gen.integers(1 << 30))
    if name == "child":
        return _child()
    raise AssertionError(f"unknown observation {name!r}")


# --------------------------------------------------------------------------------------------
# Around the run, in the main process
# --------------------------------------------------------------------------------------------


@contextmanager
def fresh_main_process(started: str = "terminal") -> Iterator[None]:
    """Each run starts with SIGCHLD at its default and torch's "handler set" flag down, as in
    a process that has run no loader yet: torch sets its SIGCHLD handler once per process,
    after its first workers start, and a forked worker inherits it; without this, whichever
    run came second would see the first one's. ``started="background"``: SIGINT, SIGQUIT
    and SIGHUP ignored, as in ``nohup python train.py &`` from a script (workers inherit
    that, and so does every program they exec). Restored afterwards."""
    ignored = [getattr(signal, name) for name in STARTED[started]]
    numbers = [signal.SIGCHLD, *ignored]
    before = [signal.getsignal(n) for n in numbers], signal_handling._SIGCHLD_handler_set
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for number in ignored:
        signal.signal(number, signal.SIG_IGN)
    signal_handling._SIGCHLD_handler_set = False
    try:
        yield
    finally:
        for number, handler in zip(numbers, before[0], strict=True):
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        signal_handling._SIGCHLD_handler_set = before[1]


def canonical_path(filename: str) -> str:
    """A warning's file as a user's filter sees it, without this machine's prefixes:
    relative to site-packages (``torch/utils/data/dataloader.py``), to the repository
    (``tests/contract/_fuzz_record.py``), or ``<stdlib>/...``; anything else as it is."""
    path = os.path.abspath(filename) if os.path.isabs(filename) else filename
    for root in _ROOTS:
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    if path.startswith(_REPO + os.sep):
        return os.path.relpath(path, _REPO)
    if path.startswith(_STDLIB + os.sep):
        return "<stdlib>/" + os.path.relpath(path, _STDLIB)
    return filename


@contextmanager
def warning_filters(mode: str) -> Iterator[list[warnings.WarningMessage]]:
    """The warning filters of ``mode`` (see the module doc), recording what gets through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(mode if mode in ("error", "default") else "always")
        if mode == "ignore_torch":
            warnings.filterwarnings("ignore", module="torch")
        yield caught


def plain_warnings(caught: list[warnings.WarningMessage]) -> list[tuple]:
    """(category, text, file, line, count), repeats in a row counted as one."""
    out: list[tuple] = []
    for w in caught:
        key = (w.category.__qualname__, str(w.message), canonical_path(w.filename), w.lineno)
        if out and out[-1][:4] == key:
            out[-1] = (*key, out[-1][4] + 1)
        else:
            out.append((*key, 1))
    return out


@contextmanager
def loud_failures() -> Iterator[list[tuple]]:
    """Record what ``sys.unraisablehook`` and ``threading.excepthook`` get (a user sees it on
    stderr) instead of printing it: the kind, whether it is a warning turned into an
    exception, the exception's type and text, for an unraisable one the type of the object
    it came from. (``quiet_failures`` says which of them a run that failed keeps.)"""
    seen: list[tuple] = []
    hooks = sys.unraisablehook, threading.excepthook

    def unraisable(u: Any) -> None:
        seen.append(("unraisable", isinstance(u.exc_value, Warning),
                     type(u.exc_value).__qualname__, str(u.exc_value)[:200],
                     type(u.object).__qualname__))

    def in_thread(a: Any) -> None:
        seen.append(("thread", isinstance(a.exc_value, Warning), a.exc_type.__qualname__,
                     str(a.exc_value)[:200]))

    sys.unraisablehook, threading.excepthook = unraisable, in_thread
    try:
        yield seen
    finally:
        sys.unraisablehook, threading.excepthook = hooks


class _Said(logging.Handler):
    def __init__(self, seen: list[tuple]) -> None:
        super().__init__(logging.INFO)
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(("log", record.name, record.levelname, record.getMessage()[:200]))


@contextmanager
def main_process_says() -> Iterator[list[tuple]]:
    """What the main process shows a user while the case runs (the module doc): text written
    to ``sys.stdout``/``sys.stderr``, and ``logging`` records at INFO and above from any logger
    (the root logger is set to INFO for the run, so that a logger without a level of its own
    passes INFO records on)."""
    seen: list[tuple] = []
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handler, level = _Said(seen), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            yield seen
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        seen.extend(("text", name, text[:400]) for name, text in
                    (("stdout", out.getvalue()), ("stderr", err.getvalue())) if text)


def quiet_failures(loud: list[tuple], failed: bool) -> list[tuple]:
    """What of ``loud`` a run compares: all of it when the run succeeded; when it failed, only
    warnings turned into exceptions. (On a failure torch prints its own secondary errors,
    e.g. "Exception ignored in ... __del__: AttributeError: ... no attribute '_shutdown'" for
    an iterator whose ``__init__`` raised; stoker need not repeat them: DESIGN 1.4.)"""
    return list(loud) if not failed else [entry for entry in loud if entry[1]]
