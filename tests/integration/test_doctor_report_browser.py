"""The doctor's HTML report opened in a real browser (Debian's ``chromium``, headless): the
verdict, the timeline and the settings bars are on the page, visible and drawn. The page is
the one ``stoker doctor --report x.html`` writes, for a recorded run; a small script appended
to a copy of it reports what the browser laid out, read back with ``--dump-dom``, and a
screenshot shows the verdict's text drawn where the browser placed it. The pictures are
inline SVG, so the browser's boxes of what is drawn in them (legends, bars, lines, texts; the
ids ``doctor/picture.py`` gives them) are checked too: a legend beside the bars, not over
them; a rate, not a ramp up from 0; a memory legend of roles whose entries are drawn; the
reason no settings were tried.

Chromium runs in its own process group with a timeout on every call; the group is killed
after each call, so none of its helpers outlives the test (the leak check around every
integration test would name it)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from _browser import CHROMIUM, MISSING, chromium, probe
from stoker._core.stats import LoaderStats
from stoker.doctor.candidates import Candidate
from stoker.doctor.measure import MemorySample, Run
from stoker.doctor.sweep import Sweep
from stoker.profile.events import EventRecorder
from stoker.workers.protocol import BatchReport

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=MISSING)
VERDICT = ("Input-bound: the training loop waited for data 90% of the time. The "
           "workers are blocked off a CPU 95% of their time (I/O, remote storage or sleeps in "
           "__getitem__), one at a time per worker as in torch; 1% waiting for a CPU.")

@pytest.fixture(scope="module", autouse=True)
def _fonts_open() -> None:
    """matplotlib keeps the font files it has drawn with open for the rest of the process:
    draw once before the leak check's first snapshot (a module fixture comes first)."""
    pytest.importorskip("matplotlib")
    from stoker.doctor.picture import _png, png_figure

    run, sweep = _recorded()
    _png(png_figure(run, sweep, VERDICT))


_PROBE = """
<script>
function seen(id) {
  const el = document.getElementById(id);
  if (!el) return {found: false};
  const r = el.getBoundingClientRect(), st = getComputedStyle(el);
  return {found: true, width: r.width, height: r.height, top: r.top + scrollY,
          shown: st.display !== "none" && st.visibility === "visible" && st.opacity !== "0",
          text: el.innerText || "", drawn: el.tagName !== "IMG" ||
            (el.complete && el.naturalWidth > 0 && el.naturalHeight > 0),
          natural: el.tagName === "IMG" ? [el.naturalWidth, el.naturalHeight] : null};
}
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({verdict: seen("verdict"), timeline: seen("timeline"),
                                    settings: seen("settings"), report: seen("report"),
                                    page: [innerWidth, document.body.scrollHeight]});
  document.body.appendChild(out);
});
</script>
"""


def _report(rate: float, packed_at: float) -> BatchReport:
    return BatchReport(concurrency=1, fetch_wall_s=0.05, fetch_cpu_s=0.002, collate_s=0.01,
                       pack_s=0.002, decisions=(), batched="", queued_s=0.0, gives_back=False,
                       init_fn_seeded=False, packed_at=packed_at)


def _recorded() -> tuple[Run, Sweep]:
    rec = EventRecorder()
    rec.started = 10.0
    for k in range(20):
        t = 10.1 + 0.05 * k
        rec.worker_batch(k % 2, _report(0.05, t), t + 0.001)
        rec.step(t - 0.04, t + 0.002, 8)
        rec.main_stage("unpack", t + 0.001, t + 0.002)
    run = Run("your setting", {}, samples_per_s=160.0, batches=20, samples=160, seconds=1.0,
              events=rec, started=10.0, warm_at=10.2,
              batch_times=[(10.102 + 0.05 * k, 8) for k in range(20)],
              stats=LoaderStats(batches=20, num_workers=2, concurrency=(1, 1)))
    more = Candidate({"num_workers": 8, "worker_concurrency": 1})
    sweep = Sweep(baselines=[Run("y", {}, samples_per_s=r) for r in (160, 158, 162)],
                  tried=[(more, Run("m", {}, samples_per_s=r)) for r in (600, 610, 590)])
    return run, sweep


@pytest.mark.timeout(300)
def test_the_html_report_shows_the_verdict_the_timeline_and_the_settings(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    from stoker.doctor.picture import write_report

    run, sweep = _recorded()
    page = tmp_path / "report.html"
    write_report(str(page), run, sweep, text="VERDICT  " + VERDICT + "\nRECOMMENDATION ...\n",
                 verdict=VERDICT)
    profile = tmp_path / "profile"
    seen = probe(page, _PROBE, profile, height=2000)
    for part in ("verdict", "timeline", "settings", "report"):
        box = seen[part]
        assert box["found"] and box["shown"] and box["drawn"], (part, box)
        assert box["width"] > 300 and box["height"] > 20, (part, box)
    assert seen["verdict"]["text"] == VERDICT
    assert seen["verdict"]["top"] < seen["timeline"]["top"] < seen["settings"]["top"]
    assert seen["timeline"]["height"] > 500 and seen["settings"]["height"] > 150
    assert seen["timeline"]["width"] <= seen["page"][0]  # fits the window: no side scrolling

    shot = tmp_path / "shot.png"
    chromium(f"--user-data-dir={profile}", "--window-size=1280,2000",
              f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), "chromium wrote no screenshot"
    from matplotlib.image import imread

    pixels = imread(str(shot))[..., :3]
    top = int(seen["verdict"]["top"])
    strip = pixels[top:top + int(seen["verdict"]["height"])]
    assert (strip.min(axis=2) < 0.3).mean() > 0.01, "the verdict's line is blank on screen"
    os.remove(shot)


_PROBE_PICTURES = """
<script>
function box(el) {
  const r = el.getBoundingClientRect();
  return {id: el.id, left: r.left, right: r.right, top: r.top, bottom: r.bottom,
          width: r.width, height: r.height};
}
function said(el) {  // the texts matplotlib drew as paths: each one's comment
  const out = [], walk = document.createTreeWalker(el, NodeFilter.SHOW_COMMENT);
  while (walk.nextNode()) out.push(walk.currentNode.nodeValue.trim());
  return out;
}
function one(id) {
  const el = document.getElementById(id);
  return el ? Object.assign(box(el), {said: said(el)}) : null;
}
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    legend_timeline: one("legend-timeline"),
    bars: Array.from(document.querySelectorAll('[id^="bar-"]'), box),
    throughput_area: one("throughput-area"), throughput_line: one("throughput-line"),
    legend_memory: one("legend-memory"),
    memory_lines: Array.from(document.querySelectorAll('[id^="memory-"]'), box),
    no_sweep: one("no-sweep"), page: [innerWidth, document.body.scrollWidth]});
  document.body.appendChild(out);
});
</script>
"""


def _four_measured_batches() -> Run:
    """Two warm-up batches and four measured ones; two epochs of two workers each (new pids
    each epoch) and a worker sampled once, beside the main process."""
    rec = EventRecorder()
    rec.started = 10.0
    times = [10.102 + 0.05 * k for k in range(6)]
    for k, t in enumerate(times):
        rec.worker_batch(k % 2, _report(0.05, t - 0.002), t - 0.001)
        rec.step(t - 0.04, t, 8)
        rec.main_stage("unpack", t - 0.001, t)
    memory = [MemorySample(10.0 + 0.05 * k, 100, "main", 300.0 + k, 250.0) for k in range(8)]
    for pids, start in (((201, 202), 10.05), ((301, 302), 10.25)):
        for pid in pids:
            memory += [MemorySample(start + 0.05 * k, pid, "worker", 120.0, 20.0 + k)
                       for k in range(3)]
    memory.append(MemorySample(10.38, 303, "worker", 110.0, 15.0))
    return Run("your setting", {}, samples_per_s=160.0, batches=4, samples=32, seconds=0.2,
               events=rec, started=10.0, warm_at=times[2], memory=memory,
               batch_times=[(t, 8) for t in times],
               stats=LoaderStats(batches=4, num_workers=2, concurrency=(1, 1)))


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"]
            and b["top"] < a["bottom"])


@pytest.mark.timeout(300)
def test_the_pictures_legends_rates_memory_and_no_sweep_reason_as_drawn(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    from stoker.doctor.conclude import _NO_SWEEP
    from stoker.doctor.picture import write_report

    busy = _NO_SWEEP["contention"]
    page = tmp_path / "report.html"
    write_report(str(page), _four_measured_batches(), None, text="VERDICT  busy\n",
                 verdict="busy", no_sweep=busy)
    seen = probe(page, _PROBE_PICTURES, tmp_path / "profile", height=2000)

    # the timeline's legend is drawn beside the lanes: it covers no bar, the main loop's least
    legend = seen["legend_timeline"]
    assert legend and legend["width"] > 20 and legend["height"] > 20, seen
    main = [b for b in seen["bars"] if b["id"].startswith("bar-main-loop-")]
    assert {b["id"] for b in main} == {"bar-main-loop-wait", "bar-main-loop-step"}, seen["bars"]
    assert all(b["width"] > 0 for b in seen["bars"]), seen["bars"]
    assert not [b["id"] for b in seen["bars"] if _overlap(b, legend)], (legend, seen["bars"])

    # four measured batches at a steady 160 samples/s: a level line, well above 0
    area, line = seen["throughput_area"], seen["throughput_line"]
    assert area and line and line["width"] > 0.3 * area["width"], (area, line)
    assert line["bottom"] < area["bottom"] - 0.5 * area["height"], (
        "the throughput line goes down to 0", area, line)
    assert line["height"] < 0.1 * area["height"], ("not a level rate", area, line)

    # memory: one legend entry per role, and every line it stands for drawn
    assert seen["legend_memory"]["said"] == ["main process", "workers"], seen["legend_memory"]
    lines = seen["memory_lines"]
    assert len(lines) == 2 * 6, lines  # PSS and USS of the main process and 5 worker pids
    assert all(x["width"] > 0 or x["height"] > 0 for x in lines), lines  # none left undrawn
    once = [x for x in lines if x["id"].startswith("memory-worker-4-")]  # pid 303: one sample
    assert len(once) == 2 and all(x["width"] > 0 and x["height"] > 0 for x in once), once

    # the sweep was skipped because the machine was busy: the picture says so, not --no-sweep
    said = " ".join(seen["no_sweep"]["said"])
    assert said == "no settings tried: " + busy, seen["no_sweep"]
    assert seen["no_sweep"]["width"] > 200
    assert seen["page"][1] <= seen["page"][0]  # nothing wider than the window
