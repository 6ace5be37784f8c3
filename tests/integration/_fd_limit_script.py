"""A loop that keeps every batch until the process runs out of file descriptors. Run as::

    python _fd_limit_script.py torch|stoker TENSORS

With the open-files limit lowered to what is open now plus ``MARGIN``, one worker yields
batches of TENSORS tensors and the loop keeps them all (each held shared tensor keeps an fd open, in
torch as in stoker's default). Prints one JSON line: the error's type, text, notes and cause,
the limit, and how many batches were held.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys

import torch
import torch.utils.data

MARGIN = 48
MOST = 10_000  # never reached under the limit: a loop that ends here held no fds


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, tensors: int) -> None:
        self.tensors = tensors

    def __iter__(self):
        for i in range(MOST):
            yield [torch.full((2,), float(i)) for _ in range(self.tensors)]


def main(which: str, tensors: int) -> None:
    if which == "torch":
        cls = torch.utils.data.DataLoader
    else:
        import stoker

        cls = stoker.DataLoader
    loader = cls(Stream(tensors), batch_size=None, num_workers=1, timeout=60)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + MARGIN
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    held: list = []
    out: dict = {"limit": limit, "type": None}
    try:
        for batch in loader:
            held.append(batch)
    except Exception as exc:
        cause = exc.__cause__
        out.update(type=type(exc).__name__, text=str(exc),
                   notes=list(getattr(exc, "__notes__", [])),
                   cause=None if cause is None else f"{type(cause).__name__}: {cause}")
        del exc
    out["held"] = len(held)
    held.clear()
    gc.collect()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
