"""The user's setting and the candidates, measured until their ranking is clear (or clearly
not), on the same dataset, in the same process.

First pass: the user's setting at the start, in the middle and at the end (their spread is
the noise), each candidate once between. Then the candidates that came out ahead by more than
``MIN_GAIN`` (at most ``CONTENDERS``) are measured again, each beside another run of the user's
setting, round after round (at most ``CONFIRM_ROUNDS`` rounds of at most ``CONTENDERS`` + 1 runs,
each run bounded as every run is: the time bound), until each is decided: better (the
comparison of its runs with the user's is significant at ``ALPHA``, a one-sided exact
Mann-Whitney test, with at least ``MIN_RUNS`` runs of each, and its median
ahead by more than the margin) or not (its median no longer ahead by the margin). A candidate
still undecided when the rounds or the time run out is reported as not measurably better.

Among the better ones the recommendation is the fastest, unless one listed earlier (the
candidates come likeliest-first for the verdict) is within the margin of it: two settings whose
difference is noise must not swap places from one run of the doctor to the next. On a busy
machine (other processes' CPU, hypervisor steal) the margin is at least ``BUSY_MIN_GAIN``.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any

from stoker.doctor.candidates import Candidate
from stoker.doctor.interrupts import NOTED
from stoker.doctor.machine import Load
from stoker.doctor.measure import Bounds, Progress, Run, measure
from stoker.doctor.target import Recipe

MIN_GAIN = 0.05
BUSY_MIN_GAIN = 0.25
ALPHA = 0.05
MIN_RUNS = 3  # 3 against 3, every one ahead: p = 1/20
CONTENDERS = 2
CONFIRM_ROUNDS = 4
BASELINE = "your setting"


def mann_whitney_p(xs: Sequence[float], ys: Sequence[float]) -> float:
    """One-sided exact p-value that ``xs`` tend to be larger than ``ys`` (ties count half)."""
    n, m = len(xs), len(ys)
    if not n or not m:
        return 1.0
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)
    # ways[k]: arrangements of n x's among m y's with k (x, y) pairs where x ranks higher.
    ways = [[[0] * (n * m + 1) for _ in range(m + 1)] for _ in range(n + 1)]
    for j in range(m + 1):
        ways[0][j][0] = 1
    for i in range(1, n + 1):
        ways[i][0][0] = 1
        for j in range(1, m + 1):
            for k in range(n * m + 1):
                # the largest value is an x (beating all j y's) or a y
                ways[i][j][k] = (ways[i - 1][j][k - j] if k >= j else 0) + ways[i][j - 1][k]
    at_least = sum(ways[n][m][k] for k in range(n * m + 1) if k >= u - 1e-9)
    return at_least / comb(n + m, n)


@dataclass
class Sweep:
    baselines: list[Run] = field(default_factory=list)
    tried: list[tuple[Candidate, Run]] = field(default_factory=list)  # every run, repeats too
    interrupted: bool = False
    cores: int = 0  # for "busy": other processes' load against the machine's cores
    order: list[Candidate] = field(default_factory=list)  # likeliest first

    @property
    def baseline_rate(self) -> float:
        rates = _rates(self.baselines)
        return statistics.median(rates) if rates else 0.0

    @property
    def noise(self) -> float:
        """Half the spread of the baseline's repeats, as a share of their median."""
        rates = _rates(self.baselines)
        if len(rates) < 2 or not self.baseline_rate:
            return 0.0
        return (max(rates) - min(rates)) / 2 / self.baseline_rate

    @property
    def busy(self) -> bool:
        return bool(self.cores) and any(x.busy(self.cores) for x in self.loads())

    @property
    def margin(self) -> float:
        return max(2 * self.noise, BUSY_MIN_GAIN if self.busy else MIN_GAIN)

    def runs_of(self, cand: Candidate) -> list[Run]:
        return [r for c, r in self.tried if c == cand]

    def rate(self, cand: Candidate) -> float:
        rates = _rates(self.runs_of(cand))
        return statistics.median(rates) if rates else 0.0

    def gain(self, run_or_cand: Run | Candidate) -> float:
        rate = (run_or_cand.samples_per_s if isinstance(run_or_cand, Run)
                else self.rate(run_or_cand))
        base = self.baseline_rate
        return rate / base - 1 if base > 0 else 0.0

    def p_value(self, cand: Candidate) -> float:
        return mann_whitney_p(_rates(self.runs_of(cand)), _rates(self.baselines))

    def better(self, cand: Candidate) -> bool:
        """Measurably faster than the user's setting (module docstring)."""
        runs = _rates(self.runs_of(cand))
        return (len(runs) >= MIN_RUNS and len(_rates(self.baselines)) >= MIN_RUNS
                and self.gain(cand) > self.margin and self.p_value(cand) <= ALPHA)

    def decided(self, cand: Candidate) -> bool:
        return self.better(cand) or self.gain(cand) <= self.margin

    def candidates(self) -> list[Candidate]:
        """Each candidate once, in the order tried."""
        out: list[Candidate] = []
        for c, _ in self.tried:
            if c not in out:
                out.append(c)
        return out

    def median_run(self, cand: Candidate) -> Run:
        return _median_run(self.runs_of(cand))

    def ranked(self) -> list[tuple[Candidate, Run]]:
        """Each candidate that ran, with its median run, fastest first."""
        done = [(c, _median_run(self.runs_of(c))) for c in self.candidates()
                if _rates(self.runs_of(c))]
        return sorted(done, key=lambda cr: -cr[1].samples_per_s)

    def best(self) -> tuple[Candidate, Run] | None:
        """The recommendation: the fastest measurably better candidate, or the earliest
        listed one within the margin of it (module docstring); None when none is better."""
        better = [c for c, _ in self.ranked() if self.better(c)]
        if not better:
            return None
        top = self.rate(better[0])
        order = self.order or self.candidates()
        ties = [c for c in better if self.rate(c) >= top / (1 + self.margin)]
        chosen = min(ties, key=lambda c: order.index(c) if c in order else len(order))
        return chosen, _median_run(self.runs_of(chosen))

    def contenders(self) -> list[Candidate]:
        """Candidates ahead by more than ``MIN_GAIN`` and not yet decided, fastest first."""
        ahead = [c for c, _ in self.ranked() if self.gain(c) > MIN_GAIN and not self.decided(c)]
        return ahead[:CONTENDERS]

    def loads(self) -> list[Load]:
        return [r.load for r in self.baselines + [r for _, r in self.tried] if r.load.known]


def _rates(runs: Sequence[Run]) -> list[float]:
    return [r.samples_per_s for r in runs if not r.error and r.samples_per_s > 0]


def _median_run(runs: Sequence[Run]) -> Run:
    good = sorted((r for r in runs if not r.error and r.samples_per_s > 0),
                  key=lambda r: r.samples_per_s)
    return good[(len(good) - 1) // 2] if good else runs[0]


MeasureOne = Callable[[str, dict[str, Any]], Run]


def recipe_runner(recipe: Recipe, bounds: Bounds, progress: Progress | None) -> MeasureOne:
    """Runs of ``recipe`` with overrides, in this process."""
    def one(label: str, overrides: dict[str, Any]) -> Run:
        return measure(functools.partial(recipe.build, overrides), Run(label, overrides),
                       bounds, progress=progress)
    return one


def run_sweep(measure_one: MeasureOne, found: Sequence[Candidate],
              announce: Callable[[str], None] | None = None, cores: int = 0) -> Sweep:
    """The first pass, then rounds of confirmation (module docstring). (The detailed run
    the verdict came from is not one of the repeats: it records a timeline and memory, and
    it is the process's first run.)"""
    sweep = Sweep(cores=cores, order=list(found))
    plan: list[Candidate | None] = list(found)
    plan.insert(len(plan) // 2, None)
    plan.insert(0, None)
    plan.append(None)
    if not _run_plan(sweep, measure_one, plan, announce, "") or not found:
        return sweep
    for k in range(1, CONFIRM_ROUNDS + 1):
        todo = sweep.contenders()
        if not todo:
            break
        if not _run_plan(sweep, measure_one, [todo[0], None, *todo[1:]], announce,
                         f"confirming, round {k}: "):
            break
    return sweep


def _run_plan(sweep: Sweep, measure_one: MeasureOne, plan: list[Candidate | None],
              announce: Callable[[str], None] | None, prefix: str) -> bool:
    """Run ``plan`` (None: the user's setting); False once interrupted."""
    for k, cand in enumerate(plan, 1):
        label = BASELINE if cand is None else cand.name()
        try:  # Ctrl-C right after the announcement (a test sends it then) is ours too
            if announce is not None:
                announce(f"{prefix}[{k}/{len(plan)}] {label}")
            run = measure_one(label, {} if cand is None else dict(cand.overrides))
            if cand is None:
                sweep.baselines.append(run)
            else:
                sweep.tried.append((cand, run))
        except KeyboardInterrupt:  # between runs, or while one was starting
            sweep.interrupted = True
            return False
        if run.interrupted or NOTED.seen:  # NOTED: a Ctrl-C a finalizer swallowed
            sweep.interrupted = True
            return False
    return True
