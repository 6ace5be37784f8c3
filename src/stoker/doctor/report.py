"""The doctor's text report: verdict, where the time goes, what to change (measured)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.doctor.candidates import code_line, defaults_left
from stoker.doctor.conclude import conclude
from stoker.doctor.diagnose import Diagnosis, Setup
from stoker.doctor.measure import Run
from stoker.doctor.sweep import Sweep
from stoker.profile.timesplit import gathered_here, splits


@dataclass(frozen=True)
class Context:
    source: str  # what was examined (module:factory, or the script)
    kwargs: Mapping[str, Any]
    setup: Setup
    step_ms: float | None  # simulated step; None: the script's real step
    draws_global_rng: bool | None = None  # rng_probe.py: seen drawing, not seen, not probed
    decode: tuple[str, ...] = ()  # decode_verdict.py's DECODE block: the image-path line


def render(ctx: Context, first: Run, diagnosis: Diagnosis, sweep: Sweep | None) -> str:
    ending = conclude(diagnosis, sweep, ctx.kwargs)
    lines = _header(ctx, first)
    lines += ["", verdict_line(diagnosis), "  what to change: " + ending.change]
    if ctx.draws_global_rng:
        lines.append("  (your __getitem__ draws from the global RNGs (random / numpy / torch): "
                     "it is not thread-safe in stoker's sense, so no thread opt-in is tried)")
    if ctx.decode:
        lines += ["", *ctx.decode]
    if first.stats.advice:  # logged only at DEBUG (NOTE [ Advice is quiet ]): shown here
        lines += ["", "ADVICE", *(f"  {text}" for text in first.stats.advice)]
    lines += ["", *where_time_goes(first, diagnosis, ctx.setup)]
    if sweep is not None:
        lines += ["", *_sweep_lines(ctx, sweep)]
    if ending.recommendation:
        lines += ["", *ending.recommendation]
    return "\n".join(lines) + "\n"


def verdict_line(diagnosis: Diagnosis) -> str:
    return "VERDICT  " + diagnosis.headline


def _header(ctx: Context, run: Run) -> list[str]:
    kw = ctx.kwargs
    step = ("the script's own training step" if ctx.step_ms is None
            else f"a simulated {ctx.step_ms:g} ms training step" if ctx.step_ms
            else "no training step (the loader alone)")
    left = defaults_left(kw)
    out = [
        f"stoker doctor: {ctx.source}",
        f"  your setting: {code_line(kw, {})}",
        *([f"    left at their defaults: {left}"] if left else []),
        f"  machine: {ctx.setup.cores} cores; against {step}",
        f"  measured {run.seconds:.1f} s after a warm-up: {run.batches} batches, "
        f"{run.samples_per_s:,.0f} samples/s (first batch after {run.first_batch_s:.2f} s)",
    ]
    if run.plan:  # NOTE [ One plan ]: each decision stoker took for this loader, and why
        out += ["  how stoker runs it:", *("  " + line for line in run.plan.splitlines()[1:])]
    if run.error:
        out.append(f"  the run failed: {run.error}")
    if run.interrupted:
        out.append("  interrupted (Ctrl-C): partial figures")
    return out


def where_time_goes(run: Run, d: Diagnosis, setup: Setup) -> list[str]:
    s = run.stats
    loop_wall = s.wait_s + s.loop_s
    work = sum(x.seconds for x in d.shares if x.of == "work")
    who = ("the training thread" if s.num_workers == 0 or s.inline or gathered_here(s)
           else f"{s.num_workers} threads of the main process" if setup.worker_type == "thread"
           else f"{s.num_workers} worker processes")
    out = [f"Where the time goes (training loop: {loop_wall:.2f} s of wall time)"]
    for x in d.shares:
        if x.of == "loop":
            out.append(_row(x.name, x.seconds, loop_wall))
    if s.device_batches:
        out.append(f"  {'host-to-device copies (GPU time, side stream)':<44}"
                   f"{s.device_copy_s:8.2f} s; the training stream waited "
                   f"{s.device_wait_s:.2f} s for them")
    else:
        out.append(f"  {'host-to-device copy':<44}" + (
            "in the step" if setup.device_copy else "not the loader's here (no device=)"))
    out.append(f"Loader work ({work:.2f} s summed over {who}; concurrent fetches each "
               "count)")
    for x in d.shares:
        if x.of == "work":
            out.append(_row(x.name, x.seconds, work))
    return out + _thread_lines(run)


def _thread_lines(run: Run) -> list[str]:
    """Per thread: wall = CPU + queued + blocked (NOTE [ Where a thread's time goes ])."""
    s = run.stats
    out = ["Per thread (wall time = on a CPU + waiting for a CPU + blocked)"]
    for x in splits(s):
        if x.wall_s <= 0:
            continue
        queued = f"{x.queued_share:4.0%}" if x.queue_measured else "  ? "
        out.append(f"  {x.who:<30}{x.wall_s:8.2f} s: CPU {x.cpu_share:4.0%}, waiting for a "
                   f"CPU {queued}, blocked {x.blocked_share:4.0%}")
    if not s.queue_measured:
        out.append("  waiting for a CPU: not measured here (no /proc schedstat); it counts "
                   "as blocked")
    idle = ("unknown" if s.cpu_idle_share is None
            else f"{s.cpu_idle_share:.0%} of the machine's CPU time was idle")
    out.append(f"  machine: {idle}; GIL waits: not measured (CPython keeps no count; in a "
               "process with several fetch threads they are part of blocked)")
    return out


def _row(name: str, seconds: float, total: float) -> str:
    share = seconds / total if total > 0 else 0.0
    return f"  {name:<44}{seconds:8.2f} s {share:5.0%}  {_bar(share)}"


def _bar(share: float, width: int = 24) -> str:
    return "#" * round(max(0.0, min(1.0, share)) * width)


def _sweep_lines(ctx: Context, sweep: Sweep) -> list[str]:
    seconds = max((r.seconds for r in sweep.baselines), default=0.0)
    out = [f"What to change, measured on your dataset (~{seconds:.0f} s each, best first; "
           "a setting run more than once shows its median)",
           f"  {'samples/s':>10}  {'vs yours':>8}   setting"]
    base = sweep.baseline_rate
    placed = False
    for cand, run in sweep.ranked():
        if not placed and run.samples_per_s < base:
            out.append(_baseline_row(sweep))
            placed = True
        gain = sweep.gain(cand)
        runs = len(sweep.runs_of(cand))
        mark = ("  better" if sweep.better(cand)
                else "  (not measurably)" if gain > sweep.margin
                else "  (within noise)" if abs(gain) <= sweep.margin else "")
        times = f" [{runs} runs]" if runs > 1 else ""
        out.append(f"  {run.samples_per_s:>10,.0f}  {gain:>+8.0%}   {cand.name()}{times}{mark}")
        if cand.opt_in:
            out.append(f"  {'':>10}  {'':>8}     {cand.opt_in}")
    if not placed:
        out.append(_baseline_row(sweep))
    for cand, run in sweep.tried:
        if run.error:
            out.append(f"  {'failed':>10}  {'':>8}   {cand.name()}: {run.error}")
    out += _trust_lines(ctx, sweep)
    return out


def _baseline_row(sweep: Sweep) -> str:
    rates = " ".join(f"{r.samples_per_s:,.0f}" for r in sweep.baselines)
    return (f"  {sweep.baseline_rate:>10,.0f}  {'':>8}   your setting (median of "
            f"{len(sweep.baselines)} runs: {rates})")


def _trust_lines(ctx: Context, sweep: Sweep) -> list[str]:
    out = [f"  noise: ±{sweep.noise:.0%} between your setting's runs; a setting counts as "
           f"better above {sweep.margin:.0%}, its runs against yours significant (3 or more "
           "runs, one-sided Mann-Whitney p <= 0.05)."]
    loads = sweep.loads()
    if loads:
        worst = max(loads, key=lambda x: x.others_cores)
        steal = max(x.steal_share for x in loads)
        text = (f"  machine: other processes kept up to {worst.others_cores:.1f} of "
                f"{ctx.setup.cores} cores busy, hypervisor steal up to {steal:.0%}")
        busy = any(x.busy(ctx.setup.cores) for x in loads)
        out.append(text + (": TOO BUSY for small differences to be real; run again on a "
                           "quiet machine." if busy else ": quiet enough."))
    if sweep.interrupted:
        out.append("  interrupted (Ctrl-C): the settings not listed were not tried.")
    return out
