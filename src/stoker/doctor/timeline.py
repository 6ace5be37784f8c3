"""A run's timeline in one shape for the trace and the picture: spans per lane, counters."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from stoker.doctor.measure import Run

STRAGGLER_FACTOR = 4.0  # a batch whose worker time is this many times the median


@dataclass(frozen=True)
class Span:
    lane: str  # "main loop", "main: receive", "worker 0", ...
    name: str  # "wait", "step", "unpack", "pin", "fetch", "collate", "pack", "fetch (straggler)"
    start: float  # seconds since the run started
    end: float


def spans(run: Run) -> list[Span]:
    rec = run.events
    if rec is None:
        return []
    t0 = run.started
    out: list[Span] = []
    steps = rec.steps()
    for k, s in enumerate(steps):
        out.append(Span("main loop", "wait", s.entered - t0, s.left - t0))
        if k + 1 < len(steps):
            out.append(Span("main loop", "step", s.left - t0, steps[k + 1].entered - t0))
    for m in rec.main_stages():
        out.append(Span("main: receive" if m.name in ("unpack", "pin") else "main loop",
                        m.name, m.start - t0, m.end - t0))
    batches = rec.worker_batches()
    typical = statistics.median([b.sent - b.fetch_start for b in batches]) if batches else 0.0
    for b in batches:
        lane = f"worker {b.worker_id}"
        slow = typical > 0 and b.sent - b.fetch_start > STRAGGLER_FACTOR * typical
        out.append(Span(lane, "fetch (straggler)" if slow else "fetch", b.fetch_start - t0,
                        b.collate_start - t0))
        out.append(Span(lane, "collate", b.collate_start - t0, b.pack_start - t0))
        out.append(Span(lane, "pack", b.pack_start - t0, b.sent - t0))
    return out


def throughput(run: Run, window_s: float | None = None) -> list[tuple[float, float]]:
    """(seconds since start, samples/s over the window ending there). The window is 0.25 s,
    or three typical gaps between batches when batches come slower than that."""
    if not run.batch_times:
        return []
    if window_s is None:
        times = [t for t, _ in run.batch_times]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        window_s = max(0.25, 3 * statistics.median(gaps)) if gaps else 0.25
    out: list[tuple[float, float]] = []
    edge = run.started + window_s
    count = 0
    for at, samples in run.batch_times:
        while at > edge:
            out.append((edge - run.started, count / window_s))
            count, edge = 0, edge + window_s
        count += samples
    out.append((edge - run.started, count / window_s))
    return out


def throughput_steps(run: Run) -> tuple[list[float], list[float]]:
    """Samples/s as steps for the picture: ``rates[k]`` held from ``edges[k]`` to
    ``edges[k + 1]`` (seconds since the run started), from the first batch on (the start-up
    before it is the timeline's, not a rate). Windows of 0.25 s, or of three typical gaps
    between batches when batches come slower; the last window takes the remainder. With
    fewer than 8 batches, one step per gap between two batches: a window holding one or two
    batches beside empty ones would draw a ramp up from 0, not a rate."""
    times = [t - run.started for t, _ in run.batch_times]
    if len(times) < 2 or times[-1] <= times[0]:
        return [], []
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    later = [n for _, n in run.batch_times[1:]]
    if len(times) < 8:
        return times, [n / gap if gap > 0 else 0.0 for n, gap in zip(later, gaps, strict=True)]
    window = max(0.25, 3 * statistics.median(gaps))
    count = max(1, math.floor((times[-1] - times[0]) / window))
    edges = [times[0] + k * window for k in range(count)] + [times[-1]]
    samples = [0] * count
    for at, n in zip(times[1:], later, strict=True):
        samples[min(int((at - times[0]) / window), count - 1)] += n
    return edges, [n / (b - a) for n, a, b in zip(samples, edges, edges[1:], strict=False)]


def lanes(found: list[Span]) -> list[str]:
    """Main lanes first, then workers in id order."""
    names = {s.lane for s in found}
    main = [n for n in ("main loop", "main: receive") if n in names]
    workers = sorted((n for n in names if n.startswith("worker ")),
                     key=lambda n: int(n.split()[1]))
    return main + workers
