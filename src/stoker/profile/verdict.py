"""The one-line answer to "is my training input-bound, and why?" (``loader.stats()``).

The verdict itself comes from the rule table in ``profile/rules.py``, the same one
``stoker doctor`` judges with; this module only words it as one line.
"""

from __future__ import annotations

import os

from stoker._core.stats import LoaderStats
from stoker.profile import rules


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), which the verdicts weigh work against;
    the doctor's too."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _figures(s: LoaderStats) -> rules.Figures:
    worker_type = "thread" if s.threads else "process" if s.num_workers else "auto"
    return rules.from_stats(s, usable_cores(), worker_type)


#: The verdicts where the CPU work of ``__getitem__`` is what the loop waits for.
CPU_BOUND = frozenset({"cpu", "main_thread", "gil", "oversubscribed"})


def kind(s: LoaderStats) -> str | None:
    """The verdict's kind (``rules.Kind``), or None before the first batch."""
    return rules.judge(_figures(s)).kind if s.batches else None


def summarize(s: LoaderStats) -> str:
    return with_advice(_verdict(s), s.advice)


def with_advice(head: str, advice: tuple[str, ...]) -> str:
    """``head``, then each piece of advice on a line of its own: with the advice quiet in the
    logs (NOTE [ Advice is quiet ]), ``print(loader.stats())`` is where it shows."""
    return "\n".join((head, *advice))


def _verdict(s: LoaderStats) -> str:
    if s.batches == 0:
        return "stoker: no batches yet."
    total = s.wait_s + s.loop_s
    share = s.wait_s / total if total > 0 else 0.0
    rate = s.samples / total if total > 0 else 0.0
    head = (f"stoker: {s.batches} batches, {rate:,.0f} samples/s; the loop waited for data "
            f"{share:.0%} of the time")
    if s.skipped:
        head += f"; {s.skipped} samples skipped"
    figures = _figures(s)
    v = rules.judge(figures)
    if v.kind == "consumer":
        return head + ". Not input-bound: the training step is the bottleneck."
    if v.kind == "device_copy":
        return head + ". Input-bound on the copy to the device: " + v.reason + ": " + (
            v.advice.text + ".")
    text = head + ". Input-bound: " + v.reason + "; " + v.advice.text + "."
    if v.kind != "device_queuing" and figures.device_waited >= rules.INPUT_BOUND_SHARE and (
            s.device_copy_s > 0):
        also = rules.judge_device(figures)
        text += f" Also: {also}."
    return text
