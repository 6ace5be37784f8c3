"""The ``stoker`` command starts without torch (issue 49, item 6): ``--version``, ``--help`` and
the parsing of every command's arguments import none of it, and a Ctrl-C while a command loads
torch ends it with one line, no traceback. Each check runs in a fresh interpreter (what is
imported depends on what ran before); what it prints is asserted whole."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from importlib import metadata

import stoker

# Run ``main(ARGS)`` of the command; print its status, stdout, stderr and the torch modules.
CHILD = """
import contextlib, io, json, sys
{before}
from stoker.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        status = main({args!r})
    except SystemExit as exc:
        status = exc.code
torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps([status, out.getvalue(), err.getvalue(), torch]))
"""

# Ctrl-C as torch's import starts (a finder that raises it), as a user's Ctrl-C lands there.
CTRL_C_IN_TORCH = """
class _CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
sys.meta_path.insert(0, _CtrlC())
"""


def _cli(args: list[str], before: str = "") -> list:
    code = textwrap.dedent(CHILD.format(args=args, before=before))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "80"})  # argparse's width
    assert (done.returncode, done.stderr) == (0, ""), done.stderr[-3000:]
    return json.loads(done.stdout)


def test_version_imports_no_torch() -> None:
    line = (f"stoker {stoker.__version__} (torch {metadata.version('torch')}, Python "
            f"{platform.python_version()})\n")
    assert _cli(["--version"]) == [0, line, "", []]


def test_help_imports_no_torch() -> None:
    status, out, err, torch = _cli(["--help"])
    assert (status, err, torch) == (0, "", [])
    assert out.startswith("usage: stoker [-h] [--version] COMMAND ...\n")
    for command in ("demo", "doctor", "pack"):
        assert f"\n    {command} " in out


def test_each_commands_help_imports_no_torch() -> None:
    for command in ("demo", "doctor", "pack"):
        status, out, err, torch = _cli([command, "--help"])
        assert (status, err, torch) == (0, "", []), command
        assert out.startswith(f"usage: stoker {command} "), out


def test_an_argument_error_imports_no_torch() -> None:
    assert _cli(["demo", "--images", "0"]) == [
        2, "",
        "usage: stoker demo [-h] [--images IMAGES] [--epochs EPOCHS]\n"
        "                   [--num-workers NUM_WORKERS] [--batch-size BATCH_SIZE]\n"
        "                   [--rounds ROUNDS] [--packed] [--compare-with MODULE:CLASS]\n"
        "stoker demo: error: argument --images: must be at least 1, got 0\n",
        [],
    ]


def test_ctrl_c_while_torch_loads_ends_with_one_line() -> None:
    assert _cli(["demo", "--images", "1"], before=CTRL_C_IN_TORCH) == [
        130, "", "stoker: interrupted\n", []]
