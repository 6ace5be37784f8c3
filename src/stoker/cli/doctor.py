"""`stoker doctor`: why is my training slow? Measured on the user's own loader.

    stoker doctor [options] MODULE:FACTORY     the factory returns a DataLoader or
                                              (dataset, loader_kwargs)
    stoker doctor [options] -- python train.py ARGS...   the script, unchanged, under the
                                              interpreter stoker runs under

The first run of the user's setting is measured in detail (the verdict, where the time goes,
the timeline for --trace / --report); then the candidates, each for --seconds, between repeats
of the user's setting. Progress goes to stderr, the report to stdout. Ctrl-C stops the
measuring and prints what was measured so far. Every argument and output path is checked
before the first run (a bad one costs nothing, not a whole measurement).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Sequence


class _KeepPaths(argparse.HelpFormatter):
    """argparse's wrapping, but never inside a word: it broke the interpreter's path at a
    hyphen (``/home/jo-`` and ``ann/.venv/bin/python`` on two lines)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stoker doctor",
        formatter_class=_KeepPaths,
        usage="%(prog)s [options] MODULE:FACTORY\n       %(prog)s [options] -- python "
        "train.py [ARGS ...]",
        description="Measure your loader on your data: is training input-bound, where does "
        "the time go, and which setting is faster (tried for a few seconds each).",
        epilog="After --, the command runs as you would type it, with these exceptions: "
        "`python` and `python3` mean the interpreter stoker runs under "
        f"({sys.executable}), not the first one on PATH, and a script given alone "
        "(-- train.py, -- ./train.py) runs with that interpreter too. Every argument and "
        "output path is checked before anything is measured.",
    )
    p.add_argument("target", nargs="?", metavar="MODULE:FACTORY",
                   help="a function returning your DataLoader or (dataset, loader_kwargs); "
                   "or give the script after --")
    p.add_argument("--seconds", type=_positive_float, default=3.0,
                   help="measured seconds per run, after a short warm-up (default 3)")
    p.add_argument("--batches", type=_positive_int, default=100_000,
                   help="at most this many batches per run (default 100000)")
    p.add_argument("--step-ms", type=_non_negative_float, default=0.0,
                   help="simulate a training step of this many ms per batch (sleeping, as "
                   "a GPU step leaves the CPU free); script mode uses the real step")
    p.add_argument("--no-sweep", action="store_true", help="diagnose only; try no settings")
    p.add_argument("--max-candidates", type=_positive_int, default=7,
                   help="settings to try at most (default 7)")
    p.add_argument("--report", metavar="PATH", help="write a picture: .html (self-contained) "
                   "or .png; needs matplotlib (pip install 'stoker[doctor]')")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON (verdict, rates, "
                   "the sweep, the recommended arguments)")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace (.json) of "
                   "the detailed run: per-worker fetch/collate/pack, main-loop waits")
    return p


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(command) == bool(args.target):
        parser.error("give either MODULE:FACTORY or a command after --, e.g. "
                     "stoker doctor train:make_loader  or  stoker doctor -- python train.py")
    if command and args.step_ms:
        parser.error("--step-ms simulates a step for MODULE:FACTORY; with a script the "
                     "script's own training step is measured. Drop --step-ms.")
    problem = check_outputs(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if command:
        from stoker.doctor.script import CommandError, resolve_command, run_script

        try:
            resolve_command(command)
        except CommandError as exc:
            print(f"stoker doctor: {exc}", file=sys.stderr)
            return 2
        return run_script(command, args)
    return run_factory(args)


def check_outputs(args: argparse.Namespace) -> str:
    """An error message for an output the doctor could not write once it has measured (the
    whole run would be lost), else ''."""
    for flag, path in (("--report", args.report), ("--json", args.json),
                       ("--trace", args.trace)):
        problem = path and _unwritable(flag, path)
        if problem:
            return problem
    if args.report:
        from stoker.doctor.picture import check_report_path

        return check_report_path(args.report)
    return ""


_EXAMPLE_NAMES = {"--report": "doctor.html", "--json": "doctor.json", "--trace": "trace.json"}


def _unwritable(flag: str, path: str) -> str:
    where = f"stoker doctor: {flag} {path!r}"
    if os.path.isdir(path):
        example = os.path.join(path, _EXAMPLE_NAMES[flag])
        return f"{where} is a directory; give a file name in it, e.g. {flag} {example}."
    folder = os.path.dirname(path) or "."
    if os.path.exists(folder) and not os.path.isdir(folder):
        return (f"{where}: {folder!r} is a file, not a directory. Name a file in an existing "
                "directory; nothing was measured.")
    if not os.path.isdir(folder):
        return (f"{where}: the directory {folder!r} does not exist. Create it first (mkdir -p "
                f"{folder}) or name a file in an existing directory; nothing was measured.")
    existed = os.path.exists(path)
    try:  # the real test (permissions, read-only mounts, root): open it as the end will
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return (f"{where}: cannot write there ({exc.strerror or exc}). Name a file you can "
                "write; nothing was measured.")
    if not existed:
        os.remove(path)
    return ""


def run_factory(args: argparse.Namespace) -> int:
    from stoker.doctor.factory import UserCodeFailed
    from stoker.doctor.progress_line import ProgressLine
    from stoker.doctor.session import Session
    from stoker.doctor.target import TargetError, load_recipe

    try:
        recipe = load_recipe(args.target)
    except TargetError as exc:
        print(f"stoker doctor: {exc}", file=sys.stderr)
        return 2
    except UserCodeFailed as exc:  # the user's error, from their own first frame
        print(f"{exc.traceback_text}stoker doctor: {exc}", file=sys.stderr)
        return 1
    session = Session(recipe, args, ProgressLine())
    return session.run()
