"""``stoker doctor -- python train.py ARGS``: the doctor's side. Each run starts the script
afresh (its own step, its own data) with ``STOKER_DOCTOR`` set; the script's first stoker
loader is measured inside it (``agent.py``) and the script is stopped at the bounds. The
candidates are the same script with arguments overridden through the environment."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from stoker.doctor.agent import CONFIG_ENV, OUT_ENV, SITECUSTOMIZE
from stoker.doctor.machine import between, mark
from stoker.doctor.measure import Run

_STARTUP_ALLOWANCE_S = 120.0  # the script's imports and set-up before its first batch


class CommandError(ValueError):
    """The command after ``--`` cannot be run; the message says what to change."""


def _this_python(program: str) -> bool:
    """``python``/``python3`` (or this version's ``python3.N``) typed as a bare name: the
    interpreter stoker runs under is meant, not whichever is first on PATH (without an activated
    virtual environment that one lacks stoker, and the user's packages)."""
    names = {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}
    return program in names


def _check_program(program: str) -> None:
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.isfile(program):
            raise CommandError(f"cannot run {program!r}: no such file.")
        if not os.access(program, os.X_OK):
            raise CommandError(
                f"cannot run {program!r}: it is not executable; make it so (chmod +x "
                f"{program}) or name its interpreter first (-- bash {program}).")
    elif shutil.which(program) is None:
        raise CommandError(
            f"cannot run {program!r}: no such program on PATH. Give the command as you would "
            "type it, e.g. stoker doctor -- python train.py")


def _check_script(script: str) -> None:
    if not os.path.isfile(script):
        raise CommandError(
            f"cannot run {script!r}: no such file (relative paths start from {os.getcwd()}).")


def resolve_command(command: list[str]) -> list[str]:
    """The command to start for ``stoker doctor -- COMMAND``, checked before any run
    (``CommandError`` saying what to change). ``python``/``python3`` and a bare ``train.py``
    run under ``sys.executable``; a Python script runs through ``stoker.doctor.child``
    (torch's DataLoader becomes stoker's); any other command (torchrun, a console script) runs
    as given and only its stoker loaders are measured."""
    program, rest = command[0], command[1:]
    if program.endswith(".py"):  # -- train.py, -- ./train.py
        _check_script(program)
        return [sys.executable, "-m", "stoker.doctor.child", program, *rest]
    if _this_python(program):
        program = sys.executable
        if not rest:
            raise CommandError(f"{command[0]} alone starts no training: give the script, e.g. "
                               f"stoker doctor -- {command[0]} train.py")
    else:
        _check_program(program)
    if os.path.basename(program).startswith("python") and rest and rest[0] != "-c":
        if not rest[0].startswith("-"):
            _check_script(rest[0])
        return [program, "-m", "stoker.doctor.child", *rest]
    return [program, *rest]


class ScriptRunner:
    def __init__(self, command: list[str], args: argparse.Namespace, workdir: str) -> None:
        self.command = resolve_command(command)
        self.args = args
        self.workdir = workdir
        self.count = 0
        self.kwargs: dict[str, Any] = {}
        self.log_path = ""
        self.draws_global_rng: bool | None = None  # probed inside the script (agent.py)
        # NOTE [ The doctor attaches from above ] in agent.py: the script's startup file
        self.startup = os.path.join(workdir, "startup")
        os.makedirs(self.startup, exist_ok=True)
        with open(os.path.join(self.startup, "sitecustomize.py"), "w", encoding="utf-8") as f:
            f.write(SITECUSTOMIZE)

    def __call__(self, label: str, overrides: dict[str, Any], detailed: bool = False) -> Run:
        self.count += 1
        out = os.path.join(self.workdir, f"run-{self.count}.json")
        self.log_path = os.path.join(self.workdir, f"run-{self.count}.log")
        config = {"batches": self.args.batches, "seconds": self.args.seconds,
                  "overrides": overrides, "detailed": detailed, "label": label}
        path = os.pathsep.join(p for p in (self.startup, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, OUT_ENV: out, CONFIG_ENV: json.dumps(config), "PYTHONPATH": path}
        before, t0 = mark(), time.perf_counter()
        interrupted = False
        with open(self.log_path, "wb") as log:
            try:
                proc = subprocess.Popen(self.command, env=env, stdout=log,
                                        stderr=subprocess.STDOUT)
            except OSError as exc:  # checked before the first run; gone since
                return Run(label, overrides, error=f"{self.command[0]} could not start: {exc}")
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
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
        run = run_from_dict(doc["run"])
        self.kwargs = self.kwargs or doc["kwargs"]
        if self.count == 1:
            self.draws_global_rng = doc.get("draws_global_rng")
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
    from stoker.doctor.progress_line import ProgressLine
    from stoker.doctor.session import ScriptSession

    with tempfile.TemporaryDirectory(prefix="stoker-doctor-") as workdir:
        runner = ScriptRunner(command, args, workdir)
        session = ScriptSession(runner, " ".join(command), args, ProgressLine())
        status = session.run()
        if status and runner.log_path and os.path.exists(runner.log_path):
            with open(runner.log_path, encoding="utf-8", errors="replace") as f:
                sys.stderr.write(f.read()[-4000:])
        return status
