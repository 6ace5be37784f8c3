"""The commands fail early and plainly: every argument and output path is checked before any
measurement or work, the user's own error is shown from the user's own frames, a Ctrl-C'd pack
says how to resume (and does), a re-pack with other options names them, and
``stoker doctor -- python train.py`` runs the interpreter stoker runs under. Each message is
asserted whole."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

import stoker
from stoker.cli import main as cli_main
from stoker.formats import TarShards

TIMEOUT_S = 120


def _stoker(args: list[str], cwd: Path, env: dict | None = None, session: bool = False,
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          start_new_session=session)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- stoker doctor ----------------------------------------------------------------------------

FACTORY = '''\
import os

open("imported", "w").close()


def _open_dataset():
    raise ValueError("cannot find /data/train")


def make_loader():
    return _open_dataset()
'''


def test_doctor_checks_the_report_path_before_anything_runs(tmp_path: Path) -> None:
    _write(tmp_path / "target.py", FACTORY)
    proc = _stoker(["doctor", "--report", "dir/that/does/not/exist/r.html",
                    "target:make_loader"], tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "stoker doctor: --report 'dir/that/does/not/exist/r.html': the directory "
        "'dir/that/does/not/exist' does not exist. Create it first (mkdir -p "
        "dir/that/does/not/exist) or name a file in an existing directory; nothing was "
        "measured.\n")
    assert not (tmp_path / "imported").exists()  # the user's module was not even imported


def test_doctor_shows_a_raising_factory_from_the_users_frames(tmp_path: Path) -> None:
    target = _write(tmp_path / "target.py", FACTORY)
    proc = _stoker(["doctor", "target:make_loader"], tmp_path)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        "Traceback (most recent call last):\n"
        f'  File "{target}", line 11, in make_loader\n'
        "    return _open_dataset()\n"
        "           ^^^^^^^^^^^^^^^\n"
        f'  File "{target}", line 7, in _open_dataset\n'
        '    raise ValueError("cannot find /data/train")\n'
        "ValueError: cannot find /data/train\n"
        "stoker doctor: target:make_loader raised the ValueError above; fix it and run the "
        "same command again.\n")


def test_doctor_shows_a_module_that_raises_on_import_from_its_own_frame(tmp_path: Path) -> None:
    target = _write(tmp_path / "broken.py", "import os\n\nDATA = os.environ['NO_SUCH_VAR']\n")
    proc = _stoker(["doctor", "broken:make_loader"], tmp_path,
                   env={k: v for k, v in os.environ.items() if k != "NO_SUCH_VAR"})
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith(
        "Traceback (most recent call last):\n"
        f'  File "{target}", line 3, in <module>\n'
        "    DATA = os.environ['NO_SUCH_VAR']\n")
    assert proc.stderr.endswith(
        "KeyError: 'NO_SUCH_VAR'\n"
        "stoker doctor: broken:make_loader: importing 'broken' raised the KeyError above; fix "
        "it and run the same command again.\n")
    assert "stoker" not in proc.stderr.split("KeyError: 'NO_SUCH_VAR'")[0].replace(
        str(tmp_path), "")  # the frames in <frozen os> are Python's own: no stoker frame


def test_doctor_command_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    proc = _stoker(["doctor", "--", "./train.py"], tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"stoker doctor: cannot run './train.py': no such file (relative paths start from "
        f"{tmp_path}).\n")


SCRIPT = '''\
import sys
import time

import torch
from torch.utils.data import DataLoader

with open(sys.argv[1], "w") as f:
    f.write(sys.executable)
loader = DataLoader(torch.arange(64.0), batch_size=8)
for _epoch in range(100_000):
    for _batch in loader:
        time.sleep(0.001)
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", [["python", "train.py"], ["./train.py"]],
                         ids=["python", "script_alone"])
def test_doctor_runs_scripts_under_its_own_interpreter(tmp_path: Path, command: list) -> None:
    """A ``python`` first on PATH (here one that fails) is not the one stoker runs under."""
    _write(tmp_path / "train.py", SCRIPT)
    fake = tmp_path / "bin"
    fake.mkdir()
    _write(fake / "python", "#!/bin/sh\necho 'the wrong python' >&2\nexit 3\n").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = _stoker(["doctor", "--seconds", "0.5", "--no-sweep", "--", *command, "ran_by"],
                   tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ran_by").read_text() == sys.executable
    assert "the wrong python" not in proc.stderr + proc.stdout


def test_doctor_help_says_which_python_runs(tmp_path: Path) -> None:
    proc = _stoker(["doctor", "--help"], tmp_path)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert ("After --, the command runs as you would type it, with these exceptions: `python` "
            "and `python3` mean the interpreter stoker runs under "
            f"({sys.executable}), not the first one on PATH, and a script given alone (-- "
            "train.py, -- ./train.py) runs with that interpreter too. Every argument and "
            "output path is checked before anything is measured.") in text


# -- stoker pack ----------------------------------------------------------------------------

DATASET = '''\
import os
import platform
import signal

import numpy as np

INTERRUPT_AT = int(os.environ.get("INTERRUPT_AT", "-1"))


class Records:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == INTERRUPT_AT and not os.path.exists("interrupted"):
            open("interrupted", "w").close()
            os.killpg(os.getpgrp(), signal.SIGINT)  # Ctrl-C: the whole process group
        return {"npy": np.arange(i, dtype=np.int32), "cls": i % 5}


def records():
    return Records()


def broken():
    return _listing("/data/train")


def _listing(root):
    raise FileNotFoundError(2, "No such file or directory", root)
'''


def _session_left(sid: int) -> list[psutil.Process]:
    left = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                left.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return left


@pytest.mark.timeout(300)
def test_ctrl_c_in_pack_says_how_to_resume_and_the_same_command_resumes(tmp_path: Path) -> None:
    _write(tmp_path / "dataset.py", DATASET)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "stoker.cli", "pack", "dataset:records", str(out),
               "--samples-per-shard", "10", "--workers", "1", "--no-progress"]
    env = {**os.environ, "INTERRUPT_AT": "25"}  # sample 25: shard 2, after shards 0 and 1
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        _, alive = psutil.wait_procs(_session_left(proc.pid), timeout=30)
        assert not alive, f"left behind by the interrupted pack: {alive}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert (proc.returncode, stdout) == (130, "")
    assert stderr == (
        "stoker pack: interrupted; run the same command again to resume: 2 of 4 shards are "
        f"finished and kept in {out}\n")
    assert sorted(p.name for p in out.iterdir()) == [
        "pack.json", "shard-000000.tar", "shard-000000.tar.idx.npz", "shard-000001.tar",
        "shard-000001.tar.idx.npz"]
    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S, start_new_session=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(
        "packed 40 samples into 4 shards, 2 kept from an earlier run (")
    assert f" in {out}: 20 samples in " in again.stdout
    assert len(TarShards(str(out))) == 40


def test_a_repack_with_other_options_names_them(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "repack_dataset.py", DATASET)
    out = tmp_path / "out"
    base = ["pack", "repack_dataset:records", str(out), "--workers", "1", "--no-progress"]
    assert cli_main([*base, "--samples-per-shard", "10"]) == 0
    capsys.readouterr()
    assert cli_main([*base, "--samples-per-shard", "4", "--jpeg-quality", "80"]) == 1
    assert capsys.readouterr().err == (
        f"stoker pack: {out} holds a pack of something else or with other options (its "
        "pack.json -> this pack): samples_per_shard 10 -> 4; jpeg_quality 90 -> 80. Run the "
        "pack with the same source and options to resume it, pack into another directory, or "
        "delete this one to start over\n")


def test_pack_checks_its_output_before_running_the_users_code(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "first_check.py", DATASET)
    (tmp_path / "a_file").write_text("x")
    assert cli_main(["pack", "first_check:broken", str(tmp_path / "a_file")]) == 1
    assert capsys.readouterr().err == (
        f"stoker pack: {tmp_path / 'a_file'} is a file, not a directory; the output of stoker "
        "pack is a directory of shards: give a new or empty directory\n")


def test_pack_shows_a_raising_factory_from_the_users_frames(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    module = _write(tmp_path / "raising_factory.py", DATASET)
    assert cli_main(["pack", "raising_factory:broken", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        "Traceback (most recent call last):\n"
        f'  File "{module}", line 26, in broken\n'
        '    return _listing("/data/train")\n'
        "           ^^^^^^^^^^^^^^^^^^^^^^^\n"
        f'  File "{module}", line 30, in _listing\n'
        '    raise FileNotFoundError(2, "No such file or directory", root)\n'
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/train'\n"
        "stoker pack: raising_factory:broken raised the FileNotFoundError above; fix it and run "
        "the same command again.\n")
    assert not (tmp_path / "out").exists()


# -- stoker --version -------------------------------------------------------------------------


def test_version(tmp_path: Path) -> None:
    proc = _stoker(["--version"], tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        f"stoker {stoker.__version__} (torch {torch.__version__}, Python "
        f"{platform.python_version()})\n")
