"""``stoker doctor -- python train.py ARGS``: the doctor's side. Each run starts the script
afresh (its own step, its own data) with ``STOKER_DOCTOR`` set; the script's first stoker
loader is measured inside it (``agent.py``) and the script is stopped at the bounds. The
candidates are the same script with arguments overridden through the environment."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from stoker.doctor.agent import CONFIG_ENV, OUT_ENV
from stoker.doctor.machine import between, mark
from stoker.doctor.measure import Run

_STARTUP_ALLOWANCE_S = 120.0  # the script's imports and set-up before its first batch


def runner_command(command: list[str]) -> list[str]:
    """``python script.py ...`` runs through ``stoker.doctor.child`` (torch's DataLoader
    becomes stoker's); any other command (torchrun, a console script) runs as given and only
    its stoker loaders are measured."""
    exe = os.path.basename(command[0])
    if exe.startswith("python") and len(command) > 1 and command[1] != "-c":
        return [command[0], "-m", "stoker.doctor.child", *command[1:]]
    return list(command)


class ScriptRunner:
    def __init__(self, command: list[str], args: argparse.Namespace, workdir: str) -> None:
        self.command = runner_command(command)
        self.args = args
        self.workdir = workdir
        self.count = 0
        self.kwargs: dict[str, Any] = {}
        self.log_path = ""

    def __call__(self, label: str, overrides: dict[str, Any], detailed: bool = False) -> Run:
        self.count += 1
        out = os.path.join(self.workdir, f"run-{self.count}.json")
        self.log_path = os.path.join(self.workdir, f"run-{self.count}.log")
        config = {"batches": self.args.batches, "seconds": self.args.seconds,
                  "overrides": overrides, "detailed": detailed, "label": label}
        env = {**os.environ, OUT_ENV: out, CONFIG_ENV: json.dumps(config)}
        before, t0 = mark(), time.perf_counter()
        interrupted = False
        with open(self.log_path, "wb") as log:
            proc = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                proc.wait(timeout=self.args.seconds * 3 + _STARTUP_ALLOWANCE_S)
            except KeyboardInterrupt:  # the script got the SIGINT too (same process group)
                interrupted = True
                _stop(proc)
            except subprocess.TimeoutExpired:
                _stop(proc)
        run = self._read(out, label, overrides, proc.returncode)
        run.load = between(before, mark(), time.perf_counter() - t0)
        run.interrupted = run.interrupted or interrupted
        return run

    def _read(self, out: str, label: str, overrides: dict[str, Any], code: int | None) -> Run:
        from stoker.doctor.records import run_from_dict

        if not os.path.exists(out):
            return Run(label, overrides, error=f"the script exited with code {code} before "
                       f"its first stoker DataLoader was built; its output: {self.log_path}")
        with open(out) as f:
            doc = json.load(f)
        run = run_from_dict(doc["run"])
        self.kwargs = self.kwargs or doc["kwargs"]
        if not doc["measured"]:
            run.error = ("the script built a stoker DataLoader but never took a batch from "
                         f"it; its output: {self.log_path}")
        elif run.batches == 0:
            run.error = (f"the script ended (code {code}) during the warm-up; its output: "
                         f"{self.log_path}")
        return run


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def run_script(command: list[str], args: argparse.Namespace) -> int:
    from stoker.cli.doctor import Progress
    from stoker.doctor.session import ScriptSession

    with tempfile.TemporaryDirectory(prefix="stoker-doctor-") as workdir:
        runner = ScriptRunner(command, args, workdir)
        session = ScriptSession(runner, " ".join(command), args, Progress())
        status = session.run()
        if status and runner.log_path and os.path.exists(runner.log_path):
            with open(runner.log_path, errors="replace") as f:
                sys.stderr.write(f.read()[-4000:])
        return status
