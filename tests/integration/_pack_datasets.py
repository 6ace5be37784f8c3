"""Datasets the pack tests hand to ``stoker pack`` as MODULE:FACTORY (a subprocess imports
this module: tests/integration is on its PYTHONPATH)."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
from torch.utils.data import Dataset

BLOCK_ENV = "STOKER_TEST_PACK_BLOCK_AT"
N = 40


class Records(Dataset[dict[str, Any]]):
    """Sample ``i``: an array, a label and a text. With ``STOKER_TEST_PACK_BLOCK_AT=k`` set,
    reading sample ``k`` blocks (up to 120 s), so a pack stops midway deterministically."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        block = os.environ.get(BLOCK_ENV)
        self.block_at = int(block) if block else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.block_at:
            threading.Event().wait(120)  # the test kills the process long before
        return {"npy": np.arange(i, dtype=np.int32), "cls": i % 5, "txt": f"sample {i}"}


def records() -> Records:
    return Records()


def pairs() -> Any:
    return [(b"x" * i, i) for i in range(7)]
