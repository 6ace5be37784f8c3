"""The detailed run as Chrome trace-event JSON (chrome://tracing, https://ui.perfetto.dev):
one process per lane group, complete ("X") events per stage, counters ("C") for throughput
and memory."""

from __future__ import annotations

import json
from typing import Any

from stoker.doctor.measure import Run
from stoker.doctor.timeline import lanes, spans, throughput

_MAIN_PID = 1


def trace_events(run: Run) -> list[dict[str, Any]]:
    found = spans(run)
    ids = {lane: k for k, lane in enumerate(lanes(found))}
    events: list[dict[str, Any]] = [_meta("process_name", _MAIN_PID, 0, "training process")]
    for lane, k in ids.items():
        pid, tid = _where(lane, k)
        if pid != _MAIN_PID:
            events.append(_meta("process_name", pid, 0, lane))
        events.append(_meta("thread_name", pid, tid, lane))
    for s in found:
        pid, tid = _where(s.lane, ids[s.lane])
        events.append({"name": s.name, "cat": "stoker", "ph": "X", "pid": pid, "tid": tid,
                       "ts": _us(s.start), "dur": max(0.0, _us(s.end) - _us(s.start))})
    for at, rate in throughput(run):
        events.append({"name": "samples/s", "ph": "C", "pid": _MAIN_PID, "tid": 0,
                       "ts": _us(at), "args": {"samples/s": rate}})
    for m in run.memory:
        events.append({"name": f"memory {m.role} {m.pid} (MiB)", "ph": "C", "pid": _MAIN_PID,
                       "tid": 0, "ts": _us(m.at - run.started),
                       "args": {"PSS": round(m.pss_mib, 2), "USS": round(m.uss_mib, 2)}})
    return events


def write_trace(path: str, run: Run) -> None:
    doc = {"traceEvents": trace_events(run), "displayTimeUnit": "ms",
           "otherData": {"tool": "stoker doctor", "run": run.label}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def _where(lane: str, k: int) -> tuple[int, int]:
    if lane.startswith("worker "):
        return 100 + int(lane.split()[1]), 1
    return _MAIN_PID, k + 1


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)
