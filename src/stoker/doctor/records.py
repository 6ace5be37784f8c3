"""A ``Run`` as JSON and back: script mode measures in the user's process and the doctor
reads the result from a file."""

from __future__ import annotations

import dataclasses
from typing import Any

from stoker._core.stats import LoaderStats, TunerEvent, WorkerTimes
from stoker.doctor.machine import Load
from stoker.doctor.measure import MemorySample, Run
from stoker.profile.events import EventRecorder


def run_to_dict(run: Run) -> dict[str, Any]:
    stats = dataclasses.asdict(run.stats)
    return {
        "label": run.label, "overrides": run.overrides, "samples_per_s": run.samples_per_s,
        "batches": run.batches, "samples": run.samples, "seconds": run.seconds,
        "first_batch_s": run.first_batch_s, "stats": stats,
        "load": dataclasses.asdict(run.load),
        "events": run.events.raw() if run.events is not None else None,
        "memory": [dataclasses.astuple(m) for m in run.memory],
        "batch_times": run.batch_times, "started": run.started, "warm_at": run.warm_at,
        "interrupted": run.interrupted, "error": run.error, "plan": run.plan,
    }


def run_from_dict(d: dict[str, Any]) -> Run:
    stats = dict(d["stats"])
    stats["concurrency"] = tuple(stats["concurrency"])
    stats["tuner"] = tuple(TunerEvent(**t) for t in stats["tuner"])
    stats["worker_times"] = tuple(WorkerTimes(*w) for w in stats.get("worker_times", ()))
    stats["beyond_torch"] = tuple(stats.get("beyond_torch", ()))
    stats["advice"] = tuple(stats.get("advice", ()))
    return Run(
        label=d["label"], overrides=dict(d["overrides"]), samples_per_s=d["samples_per_s"],
        batches=d["batches"], samples=d["samples"], seconds=d["seconds"],
        first_batch_s=d["first_batch_s"], stats=LoaderStats(**stats), load=Load(**d["load"]),
        events=EventRecorder.from_raw(d["events"]) if d["events"] else None,
        memory=[MemorySample(*m) for m in d["memory"]],
        batch_times=[(t, n) for t, n in d["batch_times"]], started=d["started"],
        warm_at=d["warm_at"], interrupted=d["interrupted"], error=d["error"],
        plan=d.get("plan", ""),
    )


def plain_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments that survive JSON (numbers, strings, bools, None); objects are dropped
    (the report shows them as ``...``)."""
    out = {k: v for k, v in kwargs.items()
           if v is None or isinstance(v, (bool, int, float, str))}
    if len(out) < len(kwargs):
        out["..."] = True  # code_line shows "..." for them
    return out
