"""A training script written for torch's DataLoader, for `stoker doctor -- python ...`
(test_doctor_cli.py): storage-bound samples (10 ms waits), a 5 ms step, several epochs.
It prints which DataLoader class it got, so the test sees the swap."""

from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Waits(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.010)
        return torch.full((4,), float(i))


def main() -> None:
    loader = DataLoader(Waits(), batch_size=8, num_workers=2)
    print("loader class:", type(loader).__module__, flush=True)
    for _epoch in range(int(sys.argv[1])):
        for _batch in loader:
            time.sleep(0.005)
    print("script finished", flush=True)


if __name__ == "__main__":
    main()
