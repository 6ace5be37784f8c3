"""A stream the loop leaves early on a persistent loader, for ``test_voice_as_torch.py``:
the worker closes the last epoch's generator when the next epoch begins. Run as::

    STOKER_PROBE_LOADER=torch|stoker python _generator_closed_script.py ignored|stack

``ignored``: the generator yields again on GeneratorExit, and Python reports "Exception ignored
in" with the frame that dropped it; ``stack``: its ``finally`` prints the frame that closes it.
Under torch that frame is torch's ``_worker_loop``, at its line that makes the new fetcher; so
must it be under stoker (NOTE [ The old fetcher goes ]).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator

import torch.utils.data as tud


class Stream(tud.IterableDataset):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __iter__(self) -> Iterator[int]:
        i = 0
        try:
            while True:
                try:
                    yield i
                except GeneratorExit:
                    if self.mode == "ignored":
                        yield -1
                    raise
                i += 1
        finally:
            if self.mode == "stack":
                caller = traceback.extract_stack()[-2]
                print("closed in", caller.name, os.path.basename(caller.filename),
                      caller.lineno, caller.line, flush=True)


def main() -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = tud.DataLoader
    loader = loader_cls(Stream(sys.argv[1]), num_workers=1, persistent_workers=True)
    for epoch in range(3):
        for batch in loader:
            print("epoch", epoch, "first", batch.tolist(), flush=True)
            break
    print("training done", flush=True)


if __name__ == "__main__":
    main()
