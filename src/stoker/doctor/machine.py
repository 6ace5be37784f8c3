"""How busy the machine was while the doctor measured: a difference between two settings is
only real if the machine gave both the same CPUs.

Read from ``/proc/stat`` (the whole machine's CPU ticks, hypervisor steal among them) and
``os.times()`` (this process and its reaped children, i.e. the loaders' workers once joined),
so "other processes" is the machine's busy time minus the doctor's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# /proc/stat cpu line: user nice system idle iowait irq softirq steal
_IDLE, _IOWAIT, _STEAL = 3, 4, 7


@dataclass(frozen=True)
class LoadMark:
    busy_s: float  # machine CPU seconds not idle (all cores), steal excluded
    steal_s: float
    total_s: float  # all CPU seconds that passed (cores x wall)
    own_s: float  # this process + reaped children, user + system
    ok: bool  # /proc/stat was readable


@dataclass(frozen=True)
class Load:
    """Between two marks: cores other processes kept busy, and the steal share."""

    others_cores: float
    steal_share: float
    known: bool

    def busy(self, cores: int) -> bool:
        return self.known and (self.others_cores > max(0.25, 0.15 * cores)
                               or self.steal_share > 0.10)


def mark() -> LoadMark:
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    try:
        with open("/proc/stat", "rb") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return LoadMark(0.0, 0.0, 0.0, own, False)
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(ticks) / hz
    busy = (sum(ticks) - ticks[_IDLE] - ticks[_IOWAIT] - ticks[_STEAL]) / hz
    return LoadMark(busy, ticks[_STEAL] / hz, total, own, len(ticks) == 8)


def between(a: LoadMark, b: LoadMark, wall_s: float) -> Load:
    if not (a.ok and b.ok) or wall_s <= 0 or b.total_s <= a.total_s:
        return Load(0.0, 0.0, False)
    others = max(0.0, (b.busy_s - a.busy_s) - (b.own_s - a.own_s)) / wall_s
    steal = (b.steal_s - a.steal_s) / (b.total_s - a.total_s)
    return Load(others, steal, True)

