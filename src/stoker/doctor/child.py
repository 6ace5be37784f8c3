"""``python -m stoker.doctor.child script.py ARGS`` (or ``-m module ARGS``): run the user's
script with ``torch.utils.data.DataLoader`` replaced by ``stoker.DataLoader`` (a subclass
taking the same arguments), so a script written for torch is measured unchanged. The doctor
starts it this way for ``stoker doctor -- python script.py``."""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> None:
    import torch.utils.data

    import stoker

    torch.utils.data.DataLoader = stoker.DataLoader  # type: ignore[misc]
    if argv[:1] == ["-m"] and len(argv) > 1:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv:
        sys.argv = list(argv)
        sys.path.insert(0, __import__("os").path.dirname(argv[0]) or ".")
        runpy.run_path(argv[0], run_name="__main__")
    else:
        raise SystemExit("usage: python -m stoker.doctor.child SCRIPT.py [ARGS] | -m MODULE")


if __name__ == "__main__":
    main(sys.argv[1:])
