"""The doctor's verdict and its recommendation, made by one function so they cannot disagree.

``conclude`` reads the diagnosis (``diagnose.py``, the rule table's verdict) and the sweep
(``sweep.py``, what was measured) and words both the VERDICT's "what to change" and the
RECOMMENDATION:

- a verdict that says the loader is not what holds training back ("consumer"), or that the
  machine is too busy to tell ("contention"), recommends no setting: the sweep is not run
  for them (``sweeps``), and the recommendation is to keep the user's setting, for the
  verdict's own reason;
- otherwise a setting is recommended only when the sweep found it measurably better
  (``Sweep.best``); the "what to change" line then names that setting;
- when nothing was measurably better, the "what to change" line says so and keeps only the
  part of the verdict's advice that is not a setting (a setting the sweep did not confirm is
  not advised), and the recommendation is to keep the user's setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.doctor.candidates import Candidate, code_line
from stoker.doctor.diagnose import Diagnosis
from stoker.doctor.sweep import Sweep

_NO_SWEEP = {
    "consumer": "the training step is the bottleneck; nothing in the loader will make "
                "training faster.",
    "contention": "the machine is too busy to tell (other processes hold the CPUs); run "
                  "again when they leave the CPUs free.",
}


def sweeps(d: Diagnosis) -> bool:
    """Whether trying settings can tell anything for this verdict."""
    return d.kind not in _NO_SWEEP


def no_sweep_reason(d: Diagnosis, asked: bool = False, interrupted: bool = False) -> str:
    """Why no settings are tried, in the words the text report gives ('' when they are):
    ``--no-sweep`` (``asked``), Ctrl-C during the first run, or the verdict's own reason."""
    if asked:
        return "you asked for none (--no-sweep)."
    if interrupted:
        return "interrupted (Ctrl-C) during the first run."
    return _NO_SWEEP.get(d.kind, "")


@dataclass(frozen=True)
class Conclusion:
    change: str  # the VERDICT's "what to change" line
    recommended: Candidate | None
    recommendation: tuple[str, ...]  # the RECOMMENDATION lines (none without a sweep)


def conclude(d: Diagnosis, sweep: Sweep | None, kwargs: Mapping[str, Any]) -> Conclusion:
    if d.kind in _NO_SWEEP:
        return Conclusion(d.advice, None,
                          ("RECOMMENDATION  keep your setting: " + _NO_SWEEP[d.kind],))
    if sweep is None:
        return Conclusion(d.advice, None, ())
    best = sweep.best()
    if best is None:
        why = ("no setting tried was measurably faster than yours"
               + (" (the machine was busy: a difference had to exceed "
                  f"{sweep.margin:.0%})" if sweep.busy else ""))
        rest = _not_a_setting(d)
        change = why[:1].upper() + why[1:] + (f"; {rest}" if rest else ".")
        return Conclusion(change, None, (f"RECOMMENDATION  keep your setting: {why}.",))
    cand, run = best
    gain = sweep.gain(cand)
    runs = len(sweep.runs_of(cand))
    lines = [f"RECOMMENDATION  {cand.name()}: {run.samples_per_s:,.0f} samples/s, "
             f"{gain:+.0%} over yours ({sweep.baseline_rate:,.0f}; median of {runs} runs, "
             f"p={sweep.p_value(cand):.2f})",
             f"  {code_line(kwargs, cand.overrides)}"]
    if cand.opt_in:
        lines.append(f"  ({cand.opt_in}: it runs several samples of a worker at once)")
    change = f"Use {cand.name()}: measured {gain:+.0%} faster on your dataset (below)."
    return Conclusion(change, cand, tuple(lines))


def _not_a_setting(d: Diagnosis) -> str:
    """The verdict's advice without a setting the sweep did not confirm."""
    if d.verdict is None:
        return ""
    advice = d.verdict.advice
    text = advice.otherwise if advice.settings else advice.text
    if not text:
        return ""
    return text + ("" if text.endswith(".") else ".")
