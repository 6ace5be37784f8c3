"""The doctor's picture: timeline per worker and the main loop, throughput and memory over
time, the sweep as bars. matplotlib (the ``doctor`` extra) draws it, without pyplot, so no
global backend is touched; ``.png`` writes the image, ``.html`` one self-contained page (the
pictures inlined as SVG, the text report beside them).

What is drawn carries ids a browser can find (``tests/integration/
test_doctor_report_browser.py`` checks the page by what Chromium lays out): ``legend-timeline``
and ``bar-<lane>-<stage>`` (``bar-main-loop-wait``), ``throughput-area`` and
``throughput-line``, ``legend-memory`` and ``memory-<role>-<k>-pss``/``-uss``, ``no-sweep``.
The legends sit beside the plots, never over them; the memory legend names a role (the main
process, the workers), not each process (workers forked again each epoch are new processes)."""

from __future__ import annotations

import html
import io
import os
from collections import defaultdict
from typing import Any

from stoker.doctor.measure import Run
from stoker.doctor.sweep import Sweep
from stoker.doctor.timeline import lanes, spans, throughput_steps

INSTALL_HINT = ("the --report picture needs matplotlib, which is not installed. Install the "
                "doctor extra: pip install 'stoker[doctor]'  (or drop --report; --trace needs "
                "nothing)")
COLORS = {"wait": "#d62728", "step": "#2ca02c", "unpack": "#9467bd", "pin": "#8c564b",
          "fetch": "#1f77b4", "fetch (straggler)": "#ff7f0e", "collate": "#17becf",
          "pack": "#bcbd22"}
_VECTOR_BARS = 3000  # a lane's stage with more bars is drawn as pixels in the SVG (its size)


class MissingPlotting(RuntimeError):
    pass


def check_report_path(path: str) -> str:
    """An error message for a path the doctor cannot write a report to, else ''."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".html", ".png"):
        return (f"stoker doctor: --report {path!r}: expected a file name ending in .html or "
                ".png (the format follows the extension).")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"stoker doctor: {INSTALL_HINT}"
    return ""


def write_report(path: str, run: Run, sweep: Sweep | None, text: str = "",
                 verdict: str = "", no_sweep: str = "") -> None:
    """``.png``: one image, the verdict line on top. ``.html``: the verdict as text, the
    timeline (with throughput and memory) and the settings tried as two pictures, then the
    whole text report (``id``s ``verdict``, ``timeline``, ``settings``, ``report``).
    ``no_sweep``: why no settings were tried (``conclude.no_sweep_reason``), drawn in their
    place."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingPlotting(INSTALL_HINT) from exc
    if path.lower().endswith(".png"):
        with open(path, "wb") as f:
            f.write(_png(png_figure(run, sweep, verdict, no_sweep)))
        return
    timeline = Figure(figsize=(12, 8.6), layout="constrained")
    _time_panels(timeline.subplots(3, 1, height_ratios=[3, 1.4, 1.4]), run)
    settings = Figure(figsize=(12, 2.6), layout="constrained")
    _sweep(settings.subplots(1, 1), sweep, no_sweep)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(verdict, _svg(timeline), _svg(settings), text))


def png_figure(run: Run, sweep: Sweep | None, verdict: str, no_sweep: str = "") -> Any:
    """The ``.png`` report: the verdict line on top, then the panels."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 11.6), layout="constrained")
    axes = fig.subplots(4, 1, height_ratios=[3, 1.4, 1.4, 1.6])
    _time_panels(axes[:3], run)
    _sweep(axes[3], sweep, no_sweep)
    if verdict:
        fig.suptitle(_wrapped(verdict), fontsize=10, x=0.01, ha="left", fontweight="bold")
    return fig


def _time_panels(axes: Any, run: Run) -> None:
    axes[1].sharex(axes[0])
    axes[2].sharex(axes[0])
    _timeline(axes[0], run)
    _throughput(axes[1], run)
    _memory(axes[2], run)


def _png(fig: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _svg(fig: Any) -> str:
    """The figure as an ``<svg>`` element to inline in a page (no XML prologue); text drawn
    as paths, so it looks the same in every browser."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    buf = io.BytesIO()
    with rc_context({"svg.fonttype": "path"}):
        FigureCanvasSVG(fig).print_svg(buf)
    svg = buf.getvalue().decode("utf-8")
    return svg[svg.index("<svg"):]


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def _wrapped(text: str, width: int = 120) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _page(verdict: str, timeline: str, settings: str, text: str) -> str:
    def picture(ident: str, label: str, svg: str) -> str:
        return f'<div id="{ident}" role="img" aria-label="{html.escape(label)}">{svg}</div>\n'

    return ("<!doctype html>\n<html><head><meta charset='utf-8'><title>stoker doctor</title>"
            "<style>#timeline svg, #settings svg {display:block; max-width:100%; height:auto}"
            "</style></head><body style='font-family:sans-serif'>\n<h1>stoker doctor</h1>\n"
            f"<h2 id='verdict'>{html.escape(verdict)}</h2>\n"
            + picture("timeline", "timeline: where each batch's time went", timeline)
            + picture("settings", "settings tried on your dataset (samples/s)", settings)
            + f"<pre id='report' style='white-space:pre-wrap'>{html.escape(text)}</pre>\n"
            "</body></html>\n")


def _timeline(ax: Any, run: Run) -> None:
    found = spans(run)
    order = lanes(found)
    bars: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for s in found:
        bars[(s.lane, s.name)].append((s.start, max(s.end - s.start, 1e-4)))
    for (lane, name), xs in bars.items():
        y = len(order) - 1 - order.index(lane)
        drawn = ax.broken_barh(xs, (y - 0.4, 0.8), facecolors=COLORS.get(name, "grey"),
                               label=name, gid=f"bar-{_slug(lane)}-{_slug(name)}")
        drawn.set_rasterized(len(xs) > _VECTOR_BARS)
    ax.set_yticks(range(len(order)), list(reversed(order)))
    ax.set_xlabel("seconds since the loader was built")
    if run.warm_at:
        ax.axvline(run.warm_at - run.started, color="black", linestyle=":", linewidth=1)
        ax.text(run.warm_at - run.started, -0.45, " measured from here", fontsize=8,
                va="bottom")
    ax.set_title(f"timeline of {run.label!r}: where each batch's time went")
    handles: dict[str, Any] = {}
    for h, lbl in zip(*ax.get_legend_handles_labels(), strict=True):
        handles.setdefault(lbl, h)
    if handles:  # beside the lanes: over them it hid the main loop's bars
        ax.legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0),
                  fontsize=8).set_gid("legend-timeline")
    if not found:
        ax.text(0.5, 0.5, "no timeline recorded", ha="center", transform=ax.transAxes)


def _throughput(ax: Any, run: Run) -> None:
    ax.patch.set_gid("throughput-area")
    edges, rates = throughput_steps(run)
    if rates:
        ax.stairs(rates, edges, baseline=None, color="#1f77b4", linewidth=1.5,
                  gid="throughput-line")
        ax.set_ylim(0, max(rates) * 1.15 or 1.0)
    else:
        ax.text(0.5, 0.5, "fewer than two batches: no rate to draw", ha="center",
                transform=ax.transAxes)
    ax.set_ylabel("samples/s")
    ax.set_title("throughput over time")


_ROLES = {"main": ("main process", "#d62728"), "worker": ("workers", "#1f77b4")}


def _memory(ax: Any, run: Run) -> None:
    by_pid: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for m in run.memory:
        by_pid[(m.role, m.pid)].append(m)
    seen: dict[str, int] = defaultdict(int)
    for (role, _pid), ms in sorted(by_pid.items(), key=lambda kv: (kv[0][0], kv[1][0].at)):
        name, color = _ROLES.get(role, (role, "grey"))
        k, first = seen[role], not seen[role]
        seen[role] += 1
        xs = [m.at - run.started for m in ms]
        marker = "." if len(ms) == 1 else None  # one sample: a dot, not an invisible line
        ax.plot(xs, [m.pss_mib for m in ms], color=color, marker=marker,
                label=name if first else "_", gid=f"memory-{role}-{k}-pss")
        ax.plot(xs, [m.uss_mib for m in ms], color=color, marker=marker, linestyle="--",
                label="_", gid=f"memory-{role}-{k}-uss")
    ax.set_ylabel("MiB")
    ax.set_title("memory per process (PSS solid, USS dashed; a line per process)")
    if by_pid:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0)
                  ).set_gid("legend-memory")
    else:
        ax.text(0.5, 0.5, "memory not sampled (needs psutil)", ha="center",
                transform=ax.transAxes)


def _sweep(ax: Any, sweep: Sweep | None, no_sweep: str = "") -> None:
    ax.set_title("settings tried on your dataset (samples/s)")
    if sweep is None:
        why = f"no settings tried: {no_sweep}" if no_sweep else "no settings tried"
        ax.text(0.5, 0.5, _wrapped(why, 110), ha="center", va="center",
                transform=ax.transAxes, gid="no-sweep")
        ax.set_axis_off()
        return
    rows = [(c.name(), r.samples_per_s) for c, r in sweep.ranked()]
    rows.append(("your setting (median)", sweep.baseline_rate))
    rows.sort(key=lambda r: r[1])
    colors = ["#7f7f7f" if name.startswith("your setting") else "#1f77b4" for name, _ in rows]
    bars = ax.barh(range(len(rows)), [r[1] for r in rows], color=colors)
    ax.bar_label(bars, labels=[f"{r[1]:,.0f}" for r in rows], fontsize=8, padding=3)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_xlabel("samples/s")
