"""What ``import stoker`` costs a script that has already imported torch (issue 35).

    .venv/bin/python benchmarks/import_time.py              # 5 fresh processes per package
    .venv/bin/python benchmarks/import_time.py --runs 11

Each run is a fresh interpreter that imports ``torch`` (not timed), then times one statement
with ``time.perf_counter`` around it, and prints the seconds. The statements take turns (A B C,
C B A, ...) so drift on a shared machine slows all alike. Measured: ``import stoker`` (no torch
of its own: what the ``stoker`` command's start needs), ``from stoker import DataLoader`` (what
a training script pays), and torchdata's ``StatefulDataLoader`` (the nearest peer) where it is
installed.

Two ways to find the modules' code, chosen in the child after ``import torch`` (torch always
reads its installed bytecode) by pointing ``sys.pycache_prefix`` at a folder of this run's:

* ``bytecode``: the ``.pyc`` files an installed package has (written to that folder by one
  unmeasured run first): what a user's script pays;
* ``source``: no bytecode (an empty folder, nothing written), every module compiled from its
  source, as in a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (this project's sandbox).

Prints one JSON record per package (median and every run, in ms, and the machine's load
average when the runs started) and a small table. Numbers only: nothing asserts a time; the
structure behind the figure (what ``import stoker`` leaves out) is
``tests/integration/test_lazy_imports.py``. To find what an import costs, read the self times of
``python -X importtime -c "import torch; import stoker"``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

# what is timed -> (the package it needs, the statement)
PACKAGES = {
    "import stoker": ("stoker", "import stoker"),
    "stoker.DataLoader": ("stoker", "from stoker import DataLoader"),
    "torchdata StatefulDataLoader": (
        "torchdata.stateful_dataloader",
        "from torchdata.stateful_dataloader import StatefulDataLoader"),
}

CHILD = """
import sys
import time
import torch
sys.pycache_prefix = {prefix!r}
sys.dont_write_bytecode = {no_write!r}
start = time.perf_counter()
{statement}
print(time.perf_counter() - start)
"""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def _one_run(label: str, prefix: str, write: bool = False) -> float:
    code = CHILD.format(statement=PACKAGES[label][1], prefix=prefix, no_write=not write)
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300,
    )
    return float(out.stdout.split()[-1])


def _measure(packages: list[str], runs: int, tmp: str) -> dict[tuple[str, str], list[float]]:
    cached, empty = os.path.join(tmp, "bytecode"), os.path.join(tmp, "none")
    for label in packages:
        _one_run(label, cached, write=True)  # writes the bytecode the `bytecode` runs read
    out: dict[tuple[str, str], list[float]] = {}
    for i in range(runs):
        for label in packages if i % 2 == 0 else packages[::-1]:
            for mode, prefix in (("bytecode", cached), ("source", empty)):
                out.setdefault((label, mode), []).append(_one_run(label, prefix) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per statement")
    args = parser.parse_args()
    packages = [label for label, (module, _) in PACKAGES.items() if _installed(module)]
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        runs = _measure(packages, args.runs, tmp)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "load_average": [round(x, 2) for x in load]}
    for (label, mode), times in runs.items():
        print(json.dumps({
            "workload": "import_after_torch", "loader": label, "variant": mode,
            "median_ms": round(statistics.median(times), 2),
            "runs_ms": [round(x, 2) for x in times], "machine": machine,
        }))
    print(f"\n# import after `import torch`, {args.runs} fresh processes each, "
          f"load average {load[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'measured':<32} {'code from':<9} {'median ms':>10}  runs ms")
    for (label, mode), times in runs.items():
        print(f"{label:<32} {mode:<9} {statistics.median(times):>10.1f}  "
              + " ".join(f"{x:.1f}" for x in times))
    for label in sorted(set(PACKAGES) - set(packages)):
        print(f"{label:<32} {'':<9} {'not installed':>10}")


if __name__ == "__main__":
    main()
