"""Ctrl-C while a worker's ``__getitem__`` runs a command-line tool (issue 44). Run as::

    STOKER_PROBE_LOADER=torch|stoker python _ctrl_c_script.py OUTDIR

in its own process group; the test sends SIGINT to the group, as a terminal does. The tool, a
Python program that relies on Python's default SIGINT handling (``KeyboardInterrupt``, which
Python does not install when SIGINT came ignored), writes ``OUTDIR/started`` (its pid) and
waits; on Ctrl-C it writes ``OUTDIR/saved`` (its partial output) and exits. It ends itself after
300 s whatever happens (SIGALRM), so a tool that never got the SIGINT cannot outlive the test by
long.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.utils.data

TOOL = r"""
import os, signal, sys
out = sys.argv[1]
signal.alarm(300)
with open(os.path.join(out, "saved.tmp"), "w") as f:  # the partial output, ready to keep
    f.write("partial output")
try:  # the Ctrl-C comes once "started" exists: from here on it is handled
    with open(os.path.join(out, "started.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, "started.tmp"), os.path.join(out, "started"))
    while True:
        signal.pause()
except KeyboardInterrupt:  # Python's default SIGINT handling, unless SIGINT came ignored
    # one rename: kept well within the 0.25 s subprocess.run gives a child on Ctrl-C
    os.rename(os.path.join(out, "saved.tmp"), os.path.join(out, "saved"))
    sys.exit(130)
"""


class RunsATool(torch.utils.data.Dataset):
    def __init__(self, out: str) -> None:
        self.out = out

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        subprocess.run([sys.executable, "-c", TOOL, self.out], check=False)
        return i


def main(out: str) -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = torch.utils.data.DataLoader
    try:
        for _ in loader_cls(RunsATool(out), batch_size=None, num_workers=1):
            pass
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
