"""The user's setting measured three times (start, middle, end: its spread is the noise) and
each candidate once between them, on the same dataset, in the same process.

A candidate counts as better only when its gain over the baseline's median exceeds both
twice the noise and ``MIN_GAIN``; on a busy machine (other processes' CPU, hypervisor steal)
the report says differences may not be real.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.doctor.candidates import Candidate
from stoker.doctor.machine import Load
from stoker.doctor.measure import Bounds, Progress, Run, measure
from stoker.doctor.target import Recipe

MIN_GAIN = 0.05
BASELINE = "your setting"


@dataclass
class Sweep:
    baselines: list[Run] = field(default_factory=list)
    tried: list[tuple[Candidate, Run]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def baseline_rate(self) -> float:
        rates = [r.samples_per_s for r in self.baselines if r.samples_per_s > 0]
        return statistics.median(rates) if rates else 0.0

    @property
    def noise(self) -> float:
        """Half the spread of the baseline's repeats, as a share of their median."""
        rates = [r.samples_per_s for r in self.baselines if r.samples_per_s > 0]
        if len(rates) < 2 or not self.baseline_rate:
            return 0.0
        return (max(rates) - min(rates)) / 2 / self.baseline_rate

    @property
    def margin(self) -> float:
        return max(2 * self.noise, MIN_GAIN)

    def gain(self, run: Run) -> float:
        base = self.baseline_rate
        return run.samples_per_s / base - 1 if base > 0 else 0.0

    def ranked(self) -> list[tuple[Candidate, Run]]:
        done = [(c, r) for c, r in self.tried if not r.error and r.samples_per_s > 0]
        return sorted(done, key=lambda cr: -cr[1].samples_per_s)

    def best(self) -> tuple[Candidate, Run] | None:
        """The fastest candidate, if it beats the baseline by more than the margin."""
        ranked = self.ranked()
        if ranked and self.gain(ranked[0][1]) > self.margin:
            return ranked[0]
        return None

    def loads(self) -> list[Load]:
        return [r.load for r in self.baselines + [r for _, r in self.tried] if r.load.known]


MeasureOne = Callable[[str, dict[str, Any]], Run]


def recipe_runner(recipe: Recipe, bounds: Bounds, progress: Progress | None) -> MeasureOne:
    """Runs of ``recipe`` with overrides, in this process."""
    def one(label: str, overrides: dict[str, Any]) -> Run:
        return measure(functools.partial(recipe.build, overrides), Run(label, overrides),
                       bounds, progress=progress)
    return one


def run_sweep(measure_one: MeasureOne, found: Sequence[Candidate],
              announce: Callable[[str], None] | None = None) -> Sweep:
    """The baseline first, in the middle and last; candidates between. (The detailed run
    the verdict came from is not one of the repeats: it records a timeline and memory, and
    it is the process's first run.)"""
    sweep = Sweep()
    plan: list[Candidate | None] = list(found)
    plan.insert(len(plan) // 2, None)
    plan.insert(0, None)
    plan.append(None)
    for k, cand in enumerate(plan, 1):
        label = BASELINE if cand is None else cand.name()
        try:  # Ctrl-C right after the announcement (a test sends it then) is ours too
            if announce is not None:
                announce(f"[{k}/{len(plan)}] {label}")
            run = measure_one(label, {} if cand is None else dict(cand.overrides))
            if cand is None:
                sweep.baselines.append(run)
            else:
                sweep.tried.append((cand, run))
        except KeyboardInterrupt:  # between runs, or while one was starting
            sweep.interrupted = True
            break
        if run.interrupted:
            sweep.interrupted = True
            break
    return sweep
