"""A live worker iterator left as cyclic garbage when the program forks, for
``test_voice_as_torch.py``: the child's collector frees its copy. Run as::

    STOKER_PROBE_LOADER=torch|stoker python _forked_copy_script.py live|ended

``live``: the iterator is mid-epoch (its worker runs); torch's ``__del__`` then asserts in the
child ("can only test a child process") and Python reports it on stderr; ``ended``: its epoch
ran out first, and the child says nothing. So must stoker's (NOTE [ A forked copy of a live
iterator says what torch's says ]).
"""

from __future__ import annotations

import gc
import os
import sys

import torch.utils.data as tud


class Trainer:
    """Refers to itself (a bound method kept as a callback), as trainer objects often do."""

    def __init__(self, loader: tud.DataLoader) -> None:
        self.loader, self.callback = loader, self.fit
        self.it = iter(loader)

    def fit(self) -> list[int]:
        return [int(b.sum()) for b in self.it]


def main() -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = tud.DataLoader
    gc.disable()  # the garbage waits for the collection the child makes
    trainer = Trainer(loader_cls(list(range(8)), batch_size=2, num_workers=1))
    print("first batch", next(trainer.it).tolist(), flush=True)
    if sys.argv[1] == "ended":
        print("rest", trainer.fit(), flush=True)
    del trainer
    pid = os.fork()
    if pid == 0:
        gc.collect()
        sys.stderr.flush()
        os._exit(0)
    print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    gc.enable()
    gc.collect()  # the parent's own collection stops the worker, under both loaders
    print("training done", flush=True)


if __name__ == "__main__":
    main()
