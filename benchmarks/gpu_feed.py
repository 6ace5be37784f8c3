"""GPU figures (issue 46) in one run: decode, feed and a training step, one JSON record.

    python benchmarks/gpu_feed.py [--out DIR] [--only PART ...] [--budget-s S] [--dry-run]

On whatever GPU and core count it finds, on the same synthetic 500x375 JPEG files:

* ``decode``: images/s and CPU seconds per image (the whole machine's, /proc/stat) at 224x224:
  (a) torch's DataLoader, Pillow + RandomResizedCrop in ``__getitem__``, a worker per core;
  (b) stoker's image path (``decode_crop_into``), same workers; (c) ``DecodeImages`` on the
  GPU through stoker's loader; (d) torchvision's batched ``decode_jpeg(device="cuda")`` in a
  bare loop (and ``DecodeImages`` bare, between c and d);
* ``feed``: batches/s delivered on the GPU by ``device=`` (and torch's pin_memory + ``.to``)
  against a plain loop copying one pre-made pinned batch, for 256x3x224x224 uint8 and 64x4096
  int64; beside them stoker's feed alone (``DeviceFeed`` over pre-made pinned batches: its own
  per-batch cost) and the workers alone (host batches, no copy: what bounds any feed);
* ``step``: ResNet-50 (bf16, channels_last, batch 256) from the JPEG files, 200 steps, the step
  time as a ratio to the step on a resident batch: torch's DataLoader at its best num_workers,
  stoker's image path, stoker with GPU decode.

Each part runs in its own forked process, in its own time budget (``BUDGETS_S``; the whole run
at most ``--budget-s``): a part that fails or runs out of time is recorded as such with what it
measured before, and the others still run. Figures print as JSON lines as they come; the
record (``record_schema.FIGURES`` filled in, ``None`` where a part did not get there) is
rewritten to DIR/gpu_feed.json after every part, and its tables print at the end.

``--dry-run`` runs every part on the CPU with tiny sizes, stoker's loader copying through the
fake device of its tests (``stoker.device.fake``) and Pillow standing in for nvJPEG: the same
code paths, no figure worth reading. Without CUDA (and no ``--dry-run``) it says why and exits
0.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from multiprocessing import get_context
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _gpu_env import DRY, FULL, Gpu, Sizes, make_jpegs  # noqa: E402
from _gpu_parts import PARTS as _PARTS  # noqa: E402
from _gpu_parts import Part  # noqa: E402
from _gpu_step import step  # noqa: E402
from gpu_table import figures_of, missing_figures, render  # noqa: E402

PARTS = {**_PARTS, "step": step}
# Seconds each part may take on 16 cores + one H100/H200 (its loops stop at their own deadlines
# before that; GRACE_S later it is killed). They add up to 340: with the install and tests/gpu,
# scripts/gpu_check.sh fits 8 minutes.
BUDGETS_S = {"machine": 15, "decode_gpu": 45, "decode_torch": 30, "decode_stoker": 30,
             "feed": 60, "step": 160}
DRY_BUDGET_S = 40  # each part's, in a dry run
GRACE_S = 10


def cuda_available() -> bool:
    """Asked in a forked child: this process must not start CUDA (or the driver) before it
    forks the parts."""
    if torch.version.cuda is None:
        return False
    probe = get_context("fork").Process(
        target=lambda: os._exit(0 if torch.cuda.is_available() else 1))
    probe.start()
    probe.join(60)
    return probe.exitcode == 0


def _child(name: str, dry: bool, sizes: Sizes, paths: list[str], budget_s: float,
           lines: str, errors: str) -> None:
    os.setsid()  # its own group: killed with its loaders' workers if it runs out of time
    # Workers started by forkserver (cuda_forkserver, CUDA being up) fork from a server that
    # imported torch and stoker once, instead of each importing them again (seconds each).
    # Named: Python 3.11's forkserver drops "__main__" from its preload (it never gets the
    # main module's path).
    multiprocessing.set_forkserver_preload(["__main__", "torch", "stoker", "stoker.image",
                                            "PIL.Image", "numpy"])
    code = 0
    try:
        gpu = Gpu(dry)
        part = Part(name, gpu, sizes, paths, os.cpu_count() or 1, time.monotonic() + budget_s,
                    lines)
        PARTS[name](part)
    except BaseException:
        with open(errors, "w") as f:
            f.write(traceback.format_exc())
        code = 1
    gc.collect()  # the part's loaders go (persistent workers stop) before this process
    sys.stdout.flush()
    os._exit(code)


def run_part(name: str, dry: bool, sizes: Sizes, paths: list[str], budget_s: float,
             workdir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one part in a forked process; (its status, its figures as emitted)."""
    lines, errors = (os.path.join(workdir, f"{name}.{ext}") for ext in ("jsonl", "err"))
    proc = get_context("fork").Process(target=_child, name=f"gpu_feed-{name}",
                                       args=(name, dry, sizes, paths, budget_s, lines, errors))
    started = time.monotonic()
    proc.start()
    proc.join(budget_s + GRACE_S)
    if proc.is_alive():
        status = {"status": f"timed out after {budget_s + GRACE_S:.0f} s"}
    elif proc.exitcode != 0:
        text = open(errors).read() if os.path.exists(errors) else ""
        status = {"status": f"failed (exit code {proc.exitcode})", "error": text[-3000:]}
    else:
        status = {"status": "ok"}
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the part, or what it left behind
    except (ProcessLookupError, PermissionError):
        pass
    proc.join(10)
    status["seconds"] = round(time.monotonic() - started, 1)
    emitted: dict[str, Any] = {}
    if os.path.exists(lines):
        for line in open(lines):
            record = json.loads(line)
            figure = record.pop("figure")
            emitted[figure] = {k: v for k, v in record.items() if k != "part"}
    return status, emitted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--only", nargs="*", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--budget-s", type=float, default=sum(BUDGETS_S.values()))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--full-sizes", action="store_true",
                        help="with --dry-run: the GPU run's sizes (its budgets, on the CPU)")
    args = parser.parse_args(argv)
    if not args.dry_run and not cuda_available():
        reason = (f"skipped: CUDA is not available (torch {torch.__version__}); these "
                  "benchmarks measure host-to-device copies and GPU decoding "
                  "(--dry-run runs their code paths on the CPU)")
        print(f"# {reason}")
        print(json.dumps({"workload": "gpu_feed", "skipped": reason}))
        return 0
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "gpu_feed.json")
    sizes = DRY if args.dry_run and not args.full_sizes else FULL
    end = time.monotonic() + args.budget_s
    record: dict[str, Any] = {
        "issue": 46, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
        "command": " ".join(["benchmarks/gpu_feed.py", *(argv or sys.argv[1:])]),
        "dry_run": args.dry_run, "sizes": sizes.__dict__, "budgets_s": {}, "parts": {},
        "emitted": {}, "figures": figures_of({}),
    }
    workdir = tempfile.mkdtemp(prefix="stoker-gpu-feed-")
    try:
        t0 = time.monotonic()
        paths = make_jpegs(os.path.join(workdir, "jpegs"), sizes)
        print(f"# {len(paths)} JPEGs {sizes.width}x{sizes.height} made in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        for name in args.only:
            own = DRY_BUDGET_S if args.dry_run else BUDGETS_S[name]
            budget = min(own, end - time.monotonic() - GRACE_S)
            record["budgets_s"][name] = round(budget, 1)
            if budget < min(5, own):
                record["parts"][name] = {"status": "skipped: the run's budget was spent"}
                continue
            status, emitted = run_part(name, args.dry_run, sizes, paths, budget, workdir)
            record["parts"][name], record["emitted"][name] = status, emitted
            print(f"# part {name}: {status['status']} in {status['seconds']} s", flush=True)
            if "error" in status:
                print(status["error"], file=sys.stderr, flush=True)
            record["machine"] = record["emitted"].get("machine", {}).get("machine", {})
            record["figures"] = figures_of(record["emitted"])
            with open(out_path + ".tmp", "w") as f:
                json.dump(record, f, indent=1)
            os.replace(out_path + ".tmp", out_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(record), flush=True)
    missing = missing_figures(record["figures"])
    print(f"# record: {out_path}; figures missing: {', '.join(missing) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
