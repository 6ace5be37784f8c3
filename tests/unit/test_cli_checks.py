"""The commands' argument checks, made before any measurement or work (no processes here; the
commands themselves run in tests/integration/test_cli_errors.py): the command after
``stoker doctor --``, the doctor's output paths, a user's factory that raises (its own frames
first) and what a re-pack with other options names."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import pytest

from stoker.cli.doctor import build_parser, check_outputs
from stoker.doctor.factory import UserCodeFailed, call_factory
from stoker.doctor.script import CommandError, resolve_command
from stoker.formats.pack_report import plan_differences

CHILD = [sys.executable, "-m", "stoker.doctor.child"]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")
    return tmp_path


# -- stoker doctor -- COMMAND ---------------------------------------------------------------


@pytest.mark.parametrize("python", ["python", "python3",
                                    f"python{sys.version_info[0]}.{sys.version_info[1]}"])
def test_python_is_the_interpreter_stoker_runs_under(in_tmp: Path, python: str) -> None:
    assert resolve_command([python, "train.py", "--lr", "1"]) == [
        *CHILD, "train.py", "--lr", "1"]
    assert resolve_command([python, "-m", "train"]) == [*CHILD, "-m", "train"]
    assert resolve_command([python, "-c", "print(1)"]) == [sys.executable, "-c", "print(1)"]


@pytest.mark.parametrize("script", ["train.py", "./train.py"])
def test_a_script_alone_runs_with_that_interpreter(in_tmp: Path, script: str) -> None:
    assert resolve_command([script, "--epochs", "2"]) == [*CHILD, script, "--epochs", "2"]


def test_the_help_prints_the_interpreters_path_whole(monkeypatch) -> None:
    # argparse wrapped the epilog at a hyphen, splitting a path such as /home/jo-ann/...
    path = "/home/jo-ann/my-long-project-name/with-more-parts/.venv-py3.11/bin/python"
    monkeypatch.setattr(sys, "executable", path)
    lines = build_parser().format_help().splitlines()
    assert any(f"({path})" in line for line in lines), lines


def test_an_interpreter_given_by_path_is_kept(in_tmp: Path) -> None:
    assert resolve_command([sys.executable, "train.py"]) == [
        sys.executable, "-m", "stoker.doctor.child", "train.py"]


def test_other_programs_run_as_given(in_tmp: Path) -> None:
    assert resolve_command(["true", "x"]) == ["true", "x"]


def _refused(command: list[str]) -> str:
    with pytest.raises(CommandError) as info:
        resolve_command(command)
    return str(info.value)


def test_commands_that_cannot_run_are_refused_in_one_line(in_tmp: Path) -> None:
    assert _refused(["no-such-program-here", "x"]) == (
        "cannot run 'no-such-program-here': no such program on PATH. Give the command as you "
        "would type it, e.g. stoker doctor -- python train.py")
    assert _refused(["./missing.sh"]) == "cannot run './missing.sh': no such file."
    (in_tmp / "run.sh").write_text("#!/bin/sh\necho hi\n")
    assert _refused(["./run.sh"]) == (
        "cannot run './run.sh': it is not executable; make it so (chmod +x ./run.sh) or name "
        "its interpreter first (-- bash ./run.sh).")
    for command in (["missing.py"], ["./missing.py"], ["python", "missing.py"]):
        assert _refused(command) == (
            f"cannot run '{command[-1]}': no such file (relative paths start from {in_tmp}).")
    assert _refused(["python"]) == (
        "python alone starts no training: give the script, e.g. stoker doctor -- python "
        "train.py")


def test_an_executable_program_by_path_is_accepted(in_tmp: Path) -> None:
    script = in_tmp / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert resolve_command(["./run.sh", "a"]) == ["./run.sh", "a"]


# -- the doctor's output paths --------------------------------------------------------------


def _outputs(**paths: str) -> str:
    return check_outputs(argparse.Namespace(**{"report": None, "json": None, "trace": None,
                                               **paths}))


def test_output_paths_are_checked_and_left_as_they_were(in_tmp: Path) -> None:
    assert _outputs(report="dir/that/does/not/exist/r.html") == (
        "stoker doctor: --report 'dir/that/does/not/exist/r.html': the directory "
        "'dir/that/does/not/exist' does not exist. Create it first (mkdir -p "
        "dir/that/does/not/exist) or name a file in an existing directory; nothing was "
        "measured.")
    assert _outputs(json=str(in_tmp)) == (
        f"stoker doctor: --json '{in_tmp}' is a directory; give a file name in it, e.g. "
        f"--json {in_tmp}/doctor.json.")
    assert _outputs(trace="nowhere/t.json") == (
        "stoker doctor: --trace 'nowhere/t.json': the directory 'nowhere' does not exist. "
        "Create it first (mkdir -p nowhere) or name a file in an existing directory; nothing "
        "was measured.")
    assert _outputs(json="train.py/d.json") == (
        "stoker doctor: --json 'train.py/d.json': 'train.py' is a file, not a directory. Name "
        "a file in an existing directory; nothing was measured.")
    assert _outputs(report="r.pdf") == (
        "stoker doctor: --report 'r.pdf': expected a file name ending in .html or .png (the "
        "format follows the extension).")
    (in_tmp / "old.json").write_text("kept")
    assert _outputs(report="r.html", json="old.json", trace="t.json") == ""
    assert (in_tmp / "old.json").read_text() == "kept"
    assert sorted(os.listdir(in_tmp)) == ["old.json", "train.py"]  # nothing made by the check


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_output_in_a_read_only_directory_is_refused(in_tmp: Path) -> None:
    locked = in_tmp / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert _outputs(json="locked/d.json") == (
            "stoker doctor: --json 'locked/d.json': cannot write there (Permission denied). "
            "Name a file you can write; nothing was measured.")
    finally:
        locked.chmod(stat.S_IRWXU)


# -- a factory that raises --------------------------------------------------------------------


def _helper() -> None:
    raise ValueError("cannot find /data/train")


def _bad_factory() -> None:
    _helper()


def test_a_factory_that_raises_shows_the_users_frames_first() -> None:
    with pytest.raises(UserCodeFailed) as info:
        call_factory(_bad_factory, "train:make_loader")
    assert str(info.value) == (
        "train:make_loader raised the ValueError above; fix it and run the same command again.")
    first, helper = _bad_factory.__code__.co_firstlineno, _helper.__code__.co_firstlineno
    assert info.value.traceback_text == (
        "Traceback (most recent call last):\n"
        f'  File "{__file__}", line {first + 1}, in _bad_factory\n'
        "    _helper()\n"
        f'  File "{__file__}", line {helper + 1}, in _helper\n'
        '    raise ValueError("cannot find /data/train")\n'
        "ValueError: cannot find /data/train\n")


# -- a re-pack with other options -----------------------------------------------------------

PLAN = {"version": 1, "source": {"kind": "dataset", "name": "Records", "samples": 40},
        "samples": 40, "samples_per_shard": 10, "shards": 4, "max_side": None,
        "jpeg_quality": 90, "name": "shard"}


def test_a_repack_names_exactly_the_options_that_differ() -> None:
    other = {**PLAN, "samples_per_shard": 4, "shards": 10, "jpeg_quality": 80}
    assert plan_differences(PLAN, other, derived_too=True) == [
        "samples_per_shard 10 -> 4", "jpeg_quality 90 -> 80"]
    # samples_per_shard from a size probe follows from the rest: not named unless given
    assert plan_differences(PLAN, other, derived_too=False) == ["jpeg_quality 90 -> 80"]
    resized = {**PLAN, "max_side": 256, "resample": "bicubic"}
    assert plan_differences(PLAN, resized, derived_too=False) == ["max_side None -> 256"]
    fewer = {**PLAN, "source": {**PLAN["source"], "samples": 39}, "samples": 39, "shards": 4}
    assert plan_differences(PLAN, fewer, derived_too=True) == ["source samples 40 -> 39"]


def test_a_long_list_that_differs_is_summarised() -> None:
    classes = [f"n{k:04d}" for k in range(1000)]
    old = {**PLAN, "source": {"kind": "image_folder", "root": "/d", "samples": 5000,
                              "classes": classes}}
    new = {**old, "source": {**old["source"], "classes": [*classes[1:], "extra"]}}
    assert plan_differences(old, new, derived_too=False) == [
        "source classes 1000 -> 1000; added 'extra'; removed 'n0000'"]
