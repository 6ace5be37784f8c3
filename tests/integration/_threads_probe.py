"""Run by test_worker_process_as_torch.py in a fresh interpreter: the thread names a program
sees in its training loop and a dataset sees in its workers, under torch's DataLoader or
stoker's (``STOKER_PROBE_LOADER``), for a few loader shapes (``sys.argv[1]``). Prints one JSON
line. NOTE [ torch's feeder thread in a worker ], NOTE [ torch's feeder threads in the main
process ].
"""

from __future__ import annotations

import json
import os
import sys
import threading

import torch
import torch.utils.data

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _polling import poll_until  # noqa: E402


def _names() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


class Seen(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> list[str]:
        return _names()


class SeenWithTensors(torch.utils.data.Dataset):
    """Batches of tensors go by fd: torch's feeder hands them to the resource sharer, whose
    thread, "Thread-N (_serve)", takes the first Thread-N number (no sample makes a thread
    before). From sample 4 on, each waits until that thread is there, which torch's feeder
    starts when it gets the GIL (NOTE [ torch's resource sharer in a worker ])."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, list[str], str]:
        if i < 4:  # whether the sharer's thread is there yet is a race, under torch too
            return torch.full((3,), i), [n for n in _names() if "(_serve)" not in n], ""
        assert poll_until(lambda: any(n.endswith(" (_serve)") for n in _names()), 120)
        return torch.full((3,), i), _names(), threading.Thread().name


class SeenStream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for _ in range(3 if info is None or info.id == 0 else 1):
            yield _names()


SHAPES = {
    # more workers than batches: only the workers torch puts to get a feeder thread
    "short_sampler": dict(dataset=Seen(1), num_workers=3),
    # a new epoch: torch puts a reset to every persistent worker
    "persistent": dict(dataset=Seen(2), num_workers=3, persistent_workers=True, epochs=2),
    "iterable": dict(dataset=SeenStream(), num_workers=2),
    "batched": dict(dataset=Seen(12), num_workers=2, batch_size=3, prefetch_factor=1),
    "tensors": dict(dataset=SeenWithTensors(), num_workers=1, batch_size=2),
}


def main(shape: str) -> None:
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = torch.utils.data.DataLoader
    kwargs = dict(SHAPES[shape])
    epochs = kwargs.pop("epochs", 1)
    kwargs.setdefault("batch_size", None)
    if shape != "tensors":  # the default collate: its batches' storages go by fd
        kwargs["collate_fn"] = lambda x: x
    loader = loader_cls(timeout=120, **kwargs)
    seen = []
    for _ in range(epochs):
        for batch in loader:
            if shape == "tensors":
                batch = [batch[0].tolist(), batch[1], batch[2]]
            seen.append({"in_workers": batch, "in_loop": _names()})
    print(json.dumps(seen, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
