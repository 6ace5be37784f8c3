"""A training script whose loader outlives its last line, for ``test_voice_as_torch.py``: its
persistent workers (or a kept iterator's) are still up when the interpreter exits, and its
dataset prints into a block-buffered stdout (a pipe, as a log file is). Run as::

    STOKER_PROBE_LOADER=torch|stoker python _alive_at_exit_script.py persistent|iterator

What reaches stdout must be the same under torch's DataLoader and stoker's (NOTE [ Workers at
interpreter exit ]), the number of exit hooks the loader registered included.
"""

from __future__ import annotations

import atexit
import os
import sys

import torch.utils.data as tud


class Chatty(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        print("loading", i)  # block-buffered in the worker: written only when flushed
        return i


def main(mode: str) -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = tud.DataLoader
    global kept  # the loader (or the iterator) lives until exit, as a module global would
    hooks_before = atexit._ncallbacks()  # a program that checks it leaks no exit hooks
    if mode == "persistent":
        kept = loader_cls(Chatty(), batch_size=2, num_workers=1, persistent_workers=True,
                          timeout=120)
        for _ in range(2):
            for _batch in kept:
                pass
    else:
        kept = iter(loader_cls(Chatty(), batch_size=2, num_workers=1, timeout=120))
        next(kept)
    print("exit hooks added:", atexit._ncallbacks() - hooks_before)
    print("training done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
