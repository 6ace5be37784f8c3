"""One doctor session on a recipe: the detailed run, the verdict, the sweep, the outputs."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from stoker.doctor.candidates import candidates
from stoker.doctor.conclude import conclude, no_sweep_reason
from stoker.doctor.decode_verdict import DecodeFinding, find
from stoker.doctor.diagnose import Diagnosis, Setup, diagnose
from stoker.doctor.measure import Bounds, Run, measure
from stoker.doctor.report import Context, render
from stoker.doctor.sweep import BASELINE, Sweep, recipe_runner, run_sweep
from stoker.doctor.target import Recipe
from stoker.profile.verdict import usable_cores


def setup_of(kwargs: Any, device_copy: bool = False) -> Setup:
    n = int(kwargs.get("num_workers", 0))
    wtype = kwargs.get("worker_type", "auto")
    if wtype == "auto":
        wtype = "process" if n > 0 else "auto"
    return Setup(num_workers=n, worker_type=wtype, cores=usable_cores(), device_copy=device_copy)


class Session:
    """``module:factory``: every run builds the recipe's loader in this process."""

    def __init__(self, recipe: Recipe, args: argparse.Namespace, progress: Any) -> None:
        self.args = args
        self.progress = progress
        self.kwargs: Any = recipe.kwargs
        self.source = recipe.source
        self.step_ms: float | None = args.step_ms
        self.bounds = Bounds(batches=args.batches, seconds=args.seconds,
                             step_s=args.step_ms / 1000)
        self.one = recipe_runner(recipe, self.bounds, progress.update)
        self.recipe = recipe
        self.draws_global_rng: bool | None = None
        self.stacks: list[str] = []  # the workers' sampled stacks (worker_stacks.py)

    def probe(self) -> None:
        """Does ``__getitem__`` draw from the global RNGs? (rng_probe.py)"""
        from stoker.doctor.rng_probe import draws_global_rng

        self.draws_global_rng = draws_global_rng(self.recipe.dataset)

    def first_run(self) -> Run:
        from stoker.doctor.worker_stacks import WorkerStacks

        # NOTE [ Sampling the workers' stacks ] in doctor/worker_stacks.py
        with WorkerStacks() as stacks:
            run = measure(self.recipe.build, Run(BASELINE, {}), self.bounds, detailed=True,
                          progress=self.progress.update)
        self.stacks = stacks.samples
        return run

    def decode_finding(self, diagnosis: Diagnosis) -> DecodeFinding | None:
        """Is the workers' time mostly an image decode? (decode_verdict.py)"""
        if not self.stacks:
            return None
        self.progress.announce("looking at the workers' sampled stacks")
        return find(self.stacks, self.recipe.dataset, diagnosis.input_bound)

    def run(self) -> int:
        from stoker.doctor.interrupts import noting_interrupts

        with noting_interrupts():
            return self._run()

    def _run(self) -> int:
        self.progress.announce(f"measuring {BASELINE} in detail")
        try:
            first = self.first_run()
        except KeyboardInterrupt:
            self.progress.done()
            print("stoker doctor: interrupted before the first run ended; nothing measured.",
                  file=sys.stderr)
            return 130
        if first.error and not first.batches:
            self.progress.done()
            print(f"stoker doctor: your loader failed: {first.error}", file=sys.stderr)
            return 1
        self.probe()
        setup = setup_of(self.kwargs)
        diagnosis = diagnose(first.stats, setup, self.draws_global_rng)
        decode = self.decode_finding(diagnosis)
        # why no settings are tried: the text says it, the picture shows it in their place
        why_not = no_sweep_reason(diagnosis, self.args.no_sweep, first.interrupted)
        sweep = None if why_not else self._sweep(first, diagnosis, setup)
        self.progress.done()
        ctx = Context(self.source, self.kwargs, setup, self.step_ms, self.draws_global_rng,
                      () if decode is None else decode.lines)
        text = render(ctx, first, diagnosis, sweep)
        print(text, end="")
        return write_outputs(self.args, Outcome(first, diagnosis, sweep, text, self.kwargs,
                                                self.draws_global_rng,
                                                None if decode is None else decode.data,
                                                why_not))

    def _sweep(self, first: Run, diagnosis: Diagnosis, setup: Setup) -> Sweep:
        import torch

        found = candidates(self.kwargs, diagnosis.kind, setup.cores,
                           torch.cuda.is_available(), limit=self.args.max_candidates,
                           draws_global_rng=self.draws_global_rng)
        return run_sweep(self.one, found, announce=self.progress.announce, cores=setup.cores)


class ScriptSession(Session):
    """``-- python train.py``: every run is the script, started afresh, measured inside."""

    def __init__(self, runner: Any, source: str, args: argparse.Namespace,
                 progress: Any) -> None:
        self.args = args
        self.progress = progress
        self.source = source
        self.step_ms = None
        self.runner = runner
        self.kwargs = {}
        self.one = runner
        self.draws_global_rng = None
        self.stacks = []  # the script's workers are not this process's children: not sampled

    def probe(self) -> None:
        self.draws_global_rng = self.runner.draws_global_rng  # probed inside the script

    def first_run(self) -> Run:
        run = self.runner(BASELINE, {}, detailed=True)
        self.kwargs = self.runner.kwargs
        return run


@dataclass(frozen=True)
class Outcome:
    first: Run
    diagnosis: Diagnosis
    sweep: Sweep | None
    text: str
    kwargs: Any = None
    draws_global_rng: bool | None = None
    decode: dict[str, Any] | None = None  # decode_verdict.py's finding; None: not sampled
    no_sweep: str = ""  # why no settings were tried (conclude.no_sweep_reason); '' if tried


def write_outputs(args: argparse.Namespace, out: Outcome) -> int:
    status = 0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary_dict(out), f, indent=1)
    if args.trace:
        from stoker.doctor.trace import write_trace

        write_trace(args.trace, out.first)
        print(f"trace written to {args.trace} (open in https://ui.perfetto.dev or "
              "chrome://tracing)")
    if args.report:
        from stoker.doctor.picture import MissingPlotting, write_report

        try:
            write_report(args.report, out.first, out.sweep, out.text,
                         verdict=out.diagnosis.headline, no_sweep=out.no_sweep)
            print(f"report written to {args.report}")
        except MissingPlotting as exc:
            print(f"stoker doctor: {exc}", file=sys.stderr)
            status = 2
    return status


def summary_dict(out: Outcome) -> dict[str, Any]:
    """The report as data (``--json``): verdict, rates, the sweep and the recommendation."""
    first, sweep = out.first, out.sweep
    ending = conclude(out.diagnosis, sweep, out.kwargs)
    doc: dict[str, Any] = {
        "verdict": out.diagnosis.kind, "input_bound": out.diagnosis.input_bound,
        "wait_share": out.diagnosis.wait_share, "headline": out.diagnosis.headline,
        "advice": out.diagnosis.advice, "what_to_change": ending.change,
        "recommended": None if ending.recommended is None
        else dict(ending.recommended.overrides),
        "recommendation": list(ending.recommendation),
        "draws_global_rng": out.draws_global_rng,
        "decode": out.decode,
        "detailed_run": _run_dict(first),
        "stats": first.stats.as_dict(),
        "where_time_goes": [{"name": x.name, "seconds": x.seconds, "of": x.of}
                            for x in out.diagnosis.shares],
    }
    if sweep is not None:
        doc["sweep"] = {
            "baseline_samples_per_s": sweep.baseline_rate, "noise": sweep.noise,
            "margin": sweep.margin, "interrupted": sweep.interrupted, "busy": sweep.busy,
            "baselines": [_run_dict(r) for r in sweep.baselines],
            "candidates": [{**_run_dict(r), "opt_in": c.opt_in, "gain": sweep.gain(c),
                            "runs": [x.samples_per_s for x in sweep.runs_of(c)],
                            "p_value": sweep.p_value(c), "better": sweep.better(c)}
                           for c, r in ((c, sweep.median_run(c)) for c in sweep.candidates())
                           if not r.error],
            "failed": [{**_run_dict(r), "opt_in": c.opt_in} for c, r in sweep.tried
                       if r.error],
            "recommended": doc["recommended"],
            "machine": [{"others_cores": x.others_cores, "steal_share": x.steal_share}
                        for x in sweep.loads()],
        }
    return doc


def _run_dict(r: Run) -> dict[str, Any]:
    return {"label": r.label, "overrides": {k: v for k, v in r.overrides.items()},
            "samples_per_s": r.samples_per_s, "batches": r.batches, "seconds": r.seconds,
            "error": r.error, "interrupted": r.interrupted}
