"""Run a framework script in fresh processes (torchrun, or plain python) with a deadline."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2] / "src"
DEADLINE_S = 100.0  # under pytest's 120 s per-test timeout


def need(*modules: str) -> None:
    """Skip with the install hint when a framework of the ``frameworks`` extra is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
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
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{output[-6000:]}"
    return output


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
