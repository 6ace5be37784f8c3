"""Run a framework script in fresh processes (torchrun, or plain python) until it ends or stalls.

A fixed deadline (it was 100 s) is a guess at how long a framework's start takes: Lightning's
``ddp_spawn`` imports torch and Lightning again in each spawned rank, which on a busy machine
took longer than the guess (issue 47). ``run`` instead waits while the script's processes make
progress: they print, or together use CPU time. It is hung when, for ``STALL_S``, its whole
process tree has printed nothing and used less than ``STALL_CPU_S`` of CPU (a wait on a peer
uses none; an import or a step on a busy machine uses some, however slowly). Then every Python
process in the tree writes its threads' stacks (``PYTHONFAULTHANDLER``: faulthandler on
SIGABRT) into the output the error shows, and the tree is killed. ``RUN_CAP_S`` bounds a run
that progresses forever.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _optional import installed

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2] / "src"
STALL_S = 60.0  # no output and (almost) no CPU used by the script's processes: hung
STALL_CPU_S = 0.5  # CPU seconds of the whole tree in STALL_S that still count as progress
RUN_CAP_S = 600.0  # a run still progressing after this is broken too (quiet: 20-40 s)
POLL_S = 1.0
# A test running the script N times gets pytest.mark.timeout(N * DEADLINE_S): only a backstop.
DEADLINE_S = RUN_CAP_S + 2 * STALL_S


def need(*modules: str) -> None:
    """Skip with the install hint when a framework of the ``frameworks`` extra is missing."""
    missing = [m for m in modules if not installed(m)]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: pip install -e '.[frameworks]' "
            "(with -c constraints.txt to keep torch pinned)"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(script: str, out: Path, *, nproc: int | None = None, args: tuple[str, ...] = ()) -> str:
    """Run ``script`` (under ``torchrun --nproc_per_node nproc`` when given); return its output."""
    cmd = [sys.executable]
    if nproc is not None:
        cmd += ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    cmd += [str(HERE / script), str(out), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONFAULTHANDLER"] = "1"  # so that a stalled run can show every process's stacks
    log = out.parent / f"{out.name}-{Path(script).stem}.log"
    with open(log, "w+") as output:
        proc = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            hung = _wait(proc, log)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        text = log.read_text(errors="replace")
    assert hung is None, f"{script} {hung}; its processes' stacks and output:\n{text[-12000:]}"
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{text[-6000:]}"
    return text


def _tree_cpu_s(root: Any) -> float:
    """CPU seconds used so far by ``root`` and its live descendants (and reaped children)."""
    import psutil

    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def _wait(proc: subprocess.Popen, log: Path) -> str | None:
    """Wait for ``proc`` to end; what was wrong if it stalled or ran past ``RUN_CAP_S`` (its
    tree's Python processes are then asked for their stacks, SIGABRT, before it is killed)."""
    import psutil

    root = psutil.Process(proc.pid)
    start = last = time.monotonic()
    seen = (log.stat().st_size, _tree_cpu_s(root))
    while True:
        try:
            proc.wait(timeout=POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        size, cpu = log.stat().st_size, _tree_cpu_s(root)
        if size != seen[0] or cpu - seen[1] >= STALL_CPU_S:
            seen, last = (size, cpu), now
        if now - last < STALL_S and now - start < RUN_CAP_S:
            continue
        why = (f"made no progress for {now - last:.0f} s (no output, under {STALL_CPU_S} s "
               f"of CPU)" if now - last >= STALL_S else f"still running after {RUN_CAP_S} s")
        for p in reversed([root, *root.children(recursive=True)]):
            try:
                p.send_signal(signal.SIGABRT)  # faulthandler writes its stacks, then it dies
            except psutil.Error:
                continue
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return why


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
