"""Notice worker memory that grows steadily (copy-on-read) and name the dataset attribute to fix.

A forked worker that reads the items of a big Python list writes their reference counts, and
the kernel copies every page written into that worker: each worker's private memory (USS)
climbs towards the size of the list during its first epoch. ``MemoryWatch`` samples the
workers' USS from the main process and, when one grows steadily, says so once with the
dataset's largest Python container and the shared container to keep it in
(``stoker.sharing``): the text in ``loader.stats().advice`` and, at DEBUG, on the
``stoker.profile.memory_watch`` logger. Not through ``warnings`` nor on stderr: torch's
DataLoader says nothing there, and a run that succeeds under torch must not stop under ``-W
error`` (NOTE [ torch's voice ] and NOTE [ Advice is quiet ] in ``_core/torch_voice.py``); the
record's ``category`` is ``stoker.CopyOnReadWarning``.

NOTE [ Memory watch sampling ]
No thread: the loader calls ``watch.sample(worker_pids)`` after every batch it hands out. That
call is a clock read and a comparison until a sample is due; then it reads ONE worker's USS
(round-robin) from ``/proc/<pid>/smaps_rollup`` (Private_Clean + Private_Dirty; psutil's
``memory_full_info`` elsewhere). The kernel walks the worker's page tables for that, and a
forked worker maps every page of its parent, so a read costs about 10-25 ms per GiB of the
parent's resident memory. The next sample is therefore due after ``interval_s`` or after 100
times the last read's duration, whichever is longer: sampling takes about 1 % of the main
process's time. The exception is a worker seen for the first time: it is read at once, so
its series starts before copy-on-read has begun. Nothing is sampled after the advice is given,
or with STOKER_MEMORY_WATCH=0.

NOTE [ Memory watch decision ]
One USS series per worker pid, from its first sample (``GrowthRule``). It *grows* when it has
at least ``min_samples`` samples, at least 75 % of the steps between samples do not fall (a dip
under 1 MiB counts as flat), and the last sample is at least max(64 MiB, 20 % of the first)
above the first. 64 MiB keeps small datasets quiet. Then:

* ``steady``: the growth without its largest single step still reaches that threshold: it is
  spread over many samples. Tell, naming the largest Python container if there is one.
* ``jump``: most of the growth happened between two samples and has held for at least two
  more. A one-off jump on its own is never told (a worker that loads one big object). But with
  ``shuffle=True`` copy-on-read *is* a jump: random reads touch every page of a list within
  a second or two, faster than the sampling (measured: one worker went 14 -> 187 -> 196 MiB
  on the 2,000,000-path list). So a jump is told only when the dataset holds a Python container
  at least half the size of the growth, which it then names.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stoker._core.torch_voice import ADVICE_LEVEL
from stoker.errors import CopyOnReadWarning
from stoker.profile.memory_suspect import (
    ContainerFinding,
    largest_container,
)

MIB = 2**20
ENV_SWITCH = "STOKER_MEMORY_WATCH"
NOTEWORTHY_CONTAINER_BYTES = MIB  # smaller containers are not named in the advice
JUMP_EXPLAINED_FRACTION = 0.5  # a jump is told if a container is at least this x the growth
_MAX_POINTS = 64  # per worker; older points are thinned out, keeping the first and the last
_MAX_OVERHEAD = 0.01  # fraction of the main process's time spent reading USS
log = logging.getLogger(__name__)




# -- reading USS ---------------------------------------------------------------------------------

_ROLLUP_OK = os.path.exists("/proc/self/smaps_rollup")


def _uss_from_rollup(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            text = fh.read()
    except OSError:  # gone, or not ours to read
        return None
    total_kib = 0
    for line in text.splitlines():
        if line.startswith(b"Private_"):  # Private_Clean, Private_Dirty, Private_Hugetlb
            total_kib += int(line.split()[1])
    return total_kib * 1024


def _uss_from_psutil(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).memory_full_info().uss)
    except (psutil.Error, OSError):
        return None


def _uss_reader() -> Callable[[int], int | None] | None:
    if _ROLLUP_OK:
        return _uss_from_rollup
    try:
        import psutil  # noqa: F401
    except ImportError:
        return None
    return _uss_from_psutil


def read_uss(pid: int) -> int | None:
    """Private memory (USS) of process ``pid`` in bytes; None if it cannot be read."""
    reader = _uss_reader()
    return None if reader is None else reader(pid)


# -- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowthRule:
    """When a worker's USS series counts as growing steadily (see the module docstring)."""

    min_samples: int = 5
    min_growth_bytes: int = 64 * MIB
    min_growth_fraction: float = 0.2
    min_non_falling_fraction: float = 0.75
    dip_tolerance_bytes: int = MIB

    def threshold(self, first: int) -> float:
        return max(self.min_growth_bytes, self.min_growth_fraction * first)


def classify_growth(
    series: Sequence[int], rule: GrowthRule = GrowthRule()
) -> Literal["steady", "jump"] | None:
    """``"steady"``, ``"jump"`` or None (no sustained growth) for the USS ``series`` (bytes,
    oldest first); see NOTE [ Memory watch decision ]."""
    if len(series) < max(3, rule.min_samples):
        return None
    steps = [b - a for a, b in zip(series, series[1:], strict=False)]
    non_falling = sum(1 for s in steps if s > -rule.dip_tolerance_bytes)
    if non_falling < rule.min_non_falling_fraction * len(steps):
        return None
    threshold = rule.threshold(series[0])
    growth = series[-1] - series[0]
    if growth < threshold:
        return None
    largest = max(steps)
    if growth - largest >= threshold:
        return "steady"
    held = len(steps) - 1 - steps.index(largest)  # samples taken after the jump
    return "jump" if held >= 2 else None


def steady_growth(series: Sequence[int], rule: GrowthRule = GrowthRule()) -> bool:
    """Whether the USS ``series`` grows steadily (spread over samples, not in one jump)."""
    return classify_growth(series, rule) == "steady"


@dataclass
class _Series:
    first_at: float
    values: list[int] = field(default_factory=list)
    count: int = 0

    def add(self, uss: int) -> None:
        if len(self.values) >= _MAX_POINTS:
            last = self.values[-1]
            self.values = self.values[::2]
            if self.values[-1] is not last:
                self.values.append(last)
        self.values.append(uss)
        self.count += 1


# -- the watch -----------------------------------------------------------------------------------

_UNSET: Any = object()


class MemoryWatch:
    """Samples workers' USS from the main process and tells once when one grows steadily:
    the text to ``tell`` (the loader's stats) and, at ``ADVICE_LEVEL``, to this module's logger.

    One per DataLoader (so a loader tells once, across epochs and worker restarts). See
    NOTE [ Memory watch sampling ] for the cost: ``max_overhead`` is the fraction of the
    caller's time that reading USS may take. ``clock`` and ``read_uss`` are for tests.
    """

    def __init__(
        self,
        dataset: Any,
        rule: GrowthRule = GrowthRule(),
        *,
        interval_s: float = 0.25,
        max_overhead: float = _MAX_OVERHEAD,
        clock: Callable[[], float] = time.monotonic,
        read_uss: Callable[[int], int | None] | None = None,
        tell: Callable[[str], object] | None = None,
    ) -> None:
        self._dataset = dataset
        self._tell = tell
        self._rule = rule
        self._interval_s = interval_s
        self._max_overhead = max_overhead
        self._clock = clock
        self._read = read_uss if read_uss is not None else _uss_reader()
        self._series: dict[int, _Series] = {}
        self._pids: tuple[int, ...] = ()
        self._turn = 0
        self._next_due = float("-inf")
        self._finding: ContainerFinding | None = _UNSET
        self.warned = False
        self.enabled = self._read is not None and os.environ.get(ENV_SWITCH, "1") != "0"

    def sample(self, worker_pids: Sequence[int]) -> None:
        """Call after each batch; reads one worker's USS when a sample is due, else returns.

        ``worker_pids``: the live workers' pids (a tuple the loader rebuilds only when its
        workers change). See NOTE [ Memory watch sampling ].
        """
        if self.warned or not self.enabled:
            return
        pids = worker_pids if isinstance(worker_pids, tuple) else tuple(worker_pids)
        if pids != self._pids:  # workers (re)started: forget the pids that are gone
            self._new_workers(pids)
            if self.warned:
                return
        now = self._clock()
        if now < self._next_due or not self._pids:
            return
        self._turn = (self._turn + 1) % len(self._pids)
        self._read_one(self._pids[self._turn], now)

    def _new_workers(self, pids: tuple[int, ...]) -> None:
        self._pids = pids
        self._series = {p: s for p, s in self._series.items() if p in self._pids}
        for pid in self._pids:
            if pid not in self._series and not self.warned:  # its baseline, at once
                self._read_one(pid, self._clock())

    def _read_one(self, pid: int, now: float) -> None:
        assert self._read is not None
        uss = self._read(pid)
        done = self._clock()
        self._next_due = done + max(self._interval_s, (done - now) / self._max_overhead)
        if uss is None:
            self._series.pop(pid, None)
        else:
            self.record(pid, uss, now=done, num_workers=len(self._pids))

    def record(
        self, pid: int, uss_bytes: int, *, now: float | None = None, num_workers: int = 1
    ) -> bool:
        """Add one USS sample of worker ``pid``; tell (once) and return True when it grows
        (NOTE [ Memory watch decision ])."""
        at = self._clock() if now is None else now
        series = self._series.get(pid)
        if series is None:
            series = self._series[pid] = _Series(first_at=at)
        series.add(uss_bytes)
        if self.warned:
            return False
        verdict = classify_growth(series.values, self._rule)
        if verdict is None:
            return False
        finding = self._suspect()
        if verdict == "jump":
            growth = series.values[-1] - series.values[0]
            if finding is None or finding.est_bytes < JUMP_EXPLAINED_FRACTION * growth:
                return False  # a one-off jump that no container explains
        self.warned = True
        text = growth_message(pid, series.values, at - series.first_at, series.count, num_workers)
        text += " " + advice(finding)
        if self._tell is not None:
            self._tell(text)
        log.log(ADVICE_LEVEL, "%s", text, extra={"category": CopyOnReadWarning})
        return True

    def _suspect(self) -> ContainerFinding | None:
        """The dataset's largest Python container, looked for once (it costs milliseconds)."""
        if self._finding is _UNSET:
            self._finding = largest_container(self._dataset)
        return self._finding


# -- the message ---------------------------------------------------------------------------------


def growth_message(
    pid: int, values: Sequence[int], elapsed_s: float, samples: int, num_workers: int
) -> str:
    each = (
        f"and each of the {num_workers} workers can grow the same way"
        if num_workers > 1
        else "and every worker can grow the same way"
    )
    return (
        f"stoker: DataLoader worker memory keeps growing: the private memory (USS) of worker "
        f"pid {pid} rose from {values[0] / MIB:.1f} MiB to {values[-1] / MIB:.1f} MiB in "
        f"{elapsed_s:.1f} s ({samples} samples), {each}."
    )


def advice(finding: ContainerFinding | None) -> str:
    """What the advice says after the measurement: the suspect and the fix, or why none."""
    switch = f"Set {ENV_SWITCH}=0 to turn this check off."
    if finding is None or finding.est_bytes < NOTEWORTHY_CONTAINER_BYTES:
        return (
            "The dataset holds no Python container of 1 MiB or more, so this is not "
            "copy-on-read of its attributes: look for objects that __getitem__ keeps across "
            "calls (a cache, a list it appends to) or large module-level Python objects it "
            f"reads. {switch}"
        )
    shared = {"str": "SharedStrList", "bytes": "SharedBytesList"}.get(finding.elem, "SharedList")
    arg = f"self.{finding.attr}"
    note = ""
    if finding.container == "dict":
        shared, arg = "SharedList", f"{arg}.items()"
        note = " (stoker has no shared dict: this keeps its (key, value) pairs by position)"
    elif finding.container in ("set", "frozenset"):
        note = f" (a {finding.container} becomes a list: index it by position)"
    return (
        "The likely cause is copy-on-read: a forked worker that reads Python objects writes "
        "their reference counts, and every memory page written is copied into that worker. "
        f"The largest Python container on the dataset is {finding.path} ({finding.kind}, "
        f"{finding.length:,} items, about {finding.est_bytes / MIB:.1f} MiB). Keep it in one "
        f"shared buffer instead, in {finding.owner}.__init__{note}:\n"
        f"    import stoker.sharing\n"
        f"    self.{finding.attr} = stoker.formats.{shared}({arg})\n"
        f"{switch}"
    )
