"""An ordinary training script's data loading, for ``test_voice_as_torch.py``: what it prints
(stdout, stderr) must be the same under torch's DataLoader and stoker's on a run that succeeds.
Run as::

    STOKER_PROBE_LOADER=torch|stoker python _quiet_script.py unconfigured|info

``info`` calls ``logging.basicConfig(level=logging.INFO)`` first, as many training scripts do;
``encoding`` (run with ``PYTHONWARNDEFAULTENCODING=1``) makes ``EncodingWarning`` an error after
torch's import, as a script hunting locale bugs does: a text file opened without ``encoding=``
while the loader loads would fail the run.
Each dataset is one a user has: a numpy generator made in ``__init__`` (every worker copies
it), torch's ``TensorDataset`` (batched as gathers), a batched ``__getitem__`` stoker reads from
its source, a plain list of paths, an IterableDataset.
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import torch
import torch.utils.data as tud


class Noisy(tud.Dataset):
    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, int(self.rng.integers(0, 1000))])


class Arrays(tud.Dataset):
    def __init__(self) -> None:
        self.x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.x[i] * 2


class Paths(tud.Dataset):
    def __init__(self) -> None:
        self.paths = [f"/data/{i:06d}.jpg" for i in range(20_000)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return len(self.paths[i])


class Stream(tud.IterableDataset):
    def __iter__(self):  # noqa: ANN204
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 24, step))


def main(mode: str) -> None:
    if mode == "info":
        logging.basicConfig(level=logging.INFO)
    if mode == "encoding":
        import warnings

        warnings.simplefilter("error", EncodingWarning)  # noqa: F821 -- Python 3.10+
    if os.environ["STOKER_PROBE_LOADER"] == "stoker":
        import stoker

        loader_cls = stoker.DataLoader
    else:
        loader_cls = tud.DataLoader
    torch.manual_seed(0)
    tensors = tud.TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    runs = [
        (Noisy(), {"num_workers": 2}),
        (tensors, {}),
        (tensors, {"num_workers": 2}),
        (Arrays(), {}),
        (Paths(), {"num_workers": 2, "batch_size": 500}),
        (Stream(), {"num_workers": 2}),
    ]
    for dataset, kwargs in runs:
        kwargs = {"batch_size": 4, **kwargs}
        if kwargs.get("num_workers"):
            kwargs["timeout"] = 120  # a worker that hangs fails the run instead
        for _ in range(2):
            total = sum(float(torch.as_tensor(b[0] if isinstance(b, list) else b).sum())
                        for b in loader_cls(dataset, **kwargs))
        print(type(dataset).__name__, total, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
