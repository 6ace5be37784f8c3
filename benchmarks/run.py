"""Benchmark runner: torch.utils.data.DataLoader vs stoker.DataLoader, measured in one run.

    .venv/bin/python benchmarks/run.py [--quick] [--only NAME ...] [--json-out PATH]

Prints where the figures come from (lines starting with '#'), one JSON record per
(workload, variant, loader) as it is measured, then a table of candidate/torch ratios.
Timings are reported, never asserted. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import compileall
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _stoker_bytecode() -> str:
    """Write stoker's bytecode next to its sources, as pip does for an installed package, before
    anything imports it. A checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (this project's
    sandbox) otherwise compiles every module stoker loads on first use (the engine, the worker
    side: NOTE [ Import only what the loader needs ]) inside the first timed batch, a cost no
    installed user pays and torch, read from its installed bytecode, never shows. Python reads
    bytecode that exists whatever that variable says."""
    spec = importlib.util.find_spec("stoker")
    if spec is None or spec.origin is None:
        return "stoker not found"
    package = os.path.dirname(spec.origin)
    compileall.compile_dir(package, quiet=1)
    return f"stoker's bytecode written under {package}"


_BYTECODE = _stoker_bytecode()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Context  # noqa: E402
from workloads import NAMES  # noqa: E402

from stoker.cli.demo import CANDIDATE  # noqa: E402

_RATIO_COLUMNS = (
    ("samples_per_s", "samples/s", "higher"),
    ("time_to_first_batch_s", "1st batch", "lower"),
    ("epoch_s", "epoch", "lower"),
    ("peak_pss_mib", "peak PSS", "lower"),
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=NAMES,
        metavar="NAME",
        help=f"workloads to run (default all): {', '.join(NAMES)}",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        metavar="PATH",
        help="also write provenance and all records as one JSON document",
    )
    parser.add_argument(
        "--compare-with",
        default=CANDIDATE,
        metavar="MODULE:CLASS",
        help="candidate loader class (default stoker:DataLoader; "
        "torch.utils.data:DataLoader gives an A/A run that shows the noise)",
    )
    parser.add_argument(
        "--candidate-first",
        action="store_true",
        help="run the candidate before torch in the first comparison (the order still "
        "alternates after it): a second round in the other order",
    )
    return parser.parse_args(argv)


def _fmt(value: float) -> str:
    return f"{value:.2f}x"


def ratio_table(records: list[dict[str, Any]], candidate: str) -> str:
    """One row per (workload, variant): candidate/torch for each measure."""
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["workload"], r["variant"]), {})[r["loader"]] = r
    head = ["workload", "variant", *[f"{label} ({better})" for _, label, better in _RATIO_COLUMNS]]
    rows = [head]
    for (workload, variant), by_loader in groups.items():
        base, cand = by_loader.get("torch"), by_loader.get(candidate)
        if base is None or cand is None:
            continue
        cells = [workload, variant or "-"]
        for key, _, _ in _RATIO_COLUMNS:
            cells.append(_fmt(cand[key] / base[key]) if base[key] > 0 else "n/a")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    fractions = [r for r in records if "fraction_of_core_limit" in r]
    for r in fractions:
        which = f"{r['workload']} ({r['variant']})" if r["variant"] else r["workload"]
        method = f", {r['method']}" if "method" in r else ""
        line = (
            f"{which}: {r['loader']}{method} reaches {r['fraction_of_core_limit']:.0%} of the "
            f"{r['cores']}-core limit ({r['core_limit_samples_per_s']:.0f} samples/s = "
            f"{r['single_process_samples_per_s']:.0f}/s single-process x {r['cores']}, measured "
            "around its run)"
        )
        if "fraction_of_two_process_plain" in r:
            line += (f"; {r['fraction_of_two_process_plain']:.0%} of {r['cores']} plain loops at "
                     f"once ({r['two_process_plain_samples_per_s']:.0f}/s)")
        lines.append(line)
    for r in records:  # a bound of user work alone, without the core limit (tiny)
        if "fraction_of_two_process_plain" in r and "fraction_of_core_limit" not in r:
            which = f"{r['workload']} ({r['variant']})" if r["variant"] else r["workload"]
            lines.append(
                f"{which}: {r['loader']} reaches {r['fraction_of_two_process_plain']:.0%} of two "
                f"processes doing only the user's work ({r['two_process_plain_samples_per_s']:.0f}"
                " samples/s, measured around its run)")
    for r in (r for r in records if "epoch_ratios" in r and r["loader"] != "torch"):
        ratios = ", ".join(f"{x:.2f}" for x in r["epoch_ratios"])
        lines.append(f"{r['workload']} ({r['variant']}): torch/{r['loader']} epoch time, "
                     f"round by round: {ratios}")
    for r in (r for r in records if "two_core_bound_s" in r):
        lines.append(
            f"stragglers: {r['loader']} runs an epoch in {r['epoch_s']:.2f} s, "
            f"{r['two_core_bound_s'] / r['epoch_s']:.0%} of the 2-core bound "
            f"({r['two_core_bound_s']:.2f} s: the epoch's CPU time / 2)"
        )
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        ctx = Context.create(quick=args.quick, candidate_spec=args.compare_with)
        ctx.comparisons = int(args.candidate_first)
    except ImportError as exc:
        print(
            f"benchmarks/run.py: cannot import the candidate loader {args.compare_with!r}: "
            f"{exc}. Is stoker.DataLoader built yet? For an A/A noise run pass "
            "--compare-with torch.utils.data:DataLoader",
            file=sys.stderr,
        )
        return 1
    provenance = [*ctx.provenance(), _BYTECODE]
    for line in provenance:
        print(f"# {line}", flush=True)
    records: list[dict[str, Any]] = []
    with ctx.sampler:
        for name in args.only or NAMES:
            start = time.perf_counter()
            module = importlib.import_module(f"workloads.{name}")
            for record in module.run(ctx):
                print(json.dumps(record), flush=True)
                records.append(record)
            print(f"# {name}: {time.perf_counter() - start:.1f} s", flush=True)
    print(f"\n{ctx.candidate}/torch ratios (same process, same Dataset, same arguments):")
    print(ratio_table(records, ctx.candidate))
    if args.json_out is not None:
        document = {"provenance": provenance, "quick": args.quick, "records": records}
        args.json_out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
