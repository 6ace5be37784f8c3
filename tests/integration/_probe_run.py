"""Run a probe script in a fresh interpreter under one loader (``STOKER_PROBE_LOADER=torch`` or
``stoker``), as a user's program would start: stoker at its defaults, whatever the shell's
``STOKER_BEYOND_TORCH`` says. For the tests that compare a whole program under torch's
DataLoader and stoker's (``test_worker_process_as_torch.py``, ``test_voice_as_torch.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUN_S = 300  # a hang guard for one fresh interpreter's run, never a timing assertion


def probe_env(loader: str, **extra_env: str) -> dict[str, str]:
    env = dict(os.environ, STOKER_PROBE_LOADER=loader, **extra_env)
    env.pop("STOKER_BEYOND_TORCH", None)
    return env


def run_probe(loader: str, script: str, *args: str, **extra_env: str
              ) -> subprocess.CompletedProcess:
    """``python <script> <args>`` from this folder; fails the test, with the script's stderr,
    unless it exits 0."""
    proc = subprocess.run([sys.executable, str(HERE / script), *args],
                          env=probe_env(loader, **extra_env), cwd=HERE, capture_output=True,
                          text=True, timeout=RUN_S)
    assert proc.returncode == 0, f"{script} {' '.join(args)} under {loader}:\n{proc.stderr}"
    return proc
