"""A program that never loads ``numpy.random`` before its loader's epoch starts, whose sampler
and dataset draw from numpy's global RNG (loading it) during the epoch. Run as::

    python _numpy_unloaded_probe.py save BATCHES OUT     # the run saved after BATCHES batches
    python _numpy_unloaded_probe.py resume OUT           # a fresh process resumed from it

``save`` writes OUT (the state and the batches after it), ``resume`` prints the batches its
resumed epoch gives as JSON. Each in a fresh interpreter: numpy's RNG is then seeded from the
OS when it loads, and only the saved state makes the second process draw what the first did.
For ``tests/integration/test_numpy_unloaded_resume.py``."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch.utils.data

import stoker


class NumpyShuffled(torch.utils.data.Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(np.random.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class NumpyDraws(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> list[int]:
        return [i, int(np.random.randint(1 << 30))]


def _loader() -> stoker.DataLoader:
    return stoker.DataLoader(NumpyDraws(), batch_size=2, sampler=NumpyShuffled(12))


def main() -> None:
    mode = sys.argv[1]
    assert "numpy.random" not in sys.modules, "the probe must start with numpy.random unloaded"
    loader = _loader()
    if mode == "save":
        count, out = int(sys.argv[2]), sys.argv[3]
        it = iter(loader)
        for _ in range(count):
            next(it)
        state = loader.state_dict()
        rest = [[t.tolist() for t in b] for b in it]
        with open(out, "w") as f:
            json.dump({"state": state, "rest": rest}, f)
        return
    with open(sys.argv[2]) as f:
        saved = json.load(f)
    loader.load_state_dict(saved["state"])
    print(json.dumps({"rest": [[t.tolist() for t in b] for b in loader],
                      "expected": saved["rest"]}))


if __name__ == "__main__":
    main()
