"""Datasets for the engine-feature tests (module level, so they pickle for any start method)."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import random
import signal
import threading

import numpy as np
import torch
from torch.utils.data import Dataset

import stoker

BLOCK_S = 30.0  # never reached in a passing test


class Corrupt(Dataset):
    """Indices in ``bad`` raise OSError, like unreadable files."""

    def __init__(self, n: int = 40, bad: tuple[int, ...] = (5, 6, 7, 8)) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.bad:
            raise OSError(f"corrupt file {i}")
        return torch.tensor(i)


class Waiting(Dataset):
    """Each fetch blocks on an event that is never set: waiting, not computing (like I/O).

    20 ms, so that waiting dominates a fetch's wall time even when the machine is busy and
    the thread waits a few ms for a CPU afterwards.
    """

    wait_s = 0.02

    def __init__(self, n: int = 480) -> None:
        self.n = n
        self._never = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self._never.wait(self.wait_s)
        return torch.tensor([i, os.getpid()])


class WaitingWithGlobalRng(Waiting):
    def __getitem__(self, i: int) -> torch.Tensor:
        self._never.wait(self.wait_s)
        return torch.tensor([i, random.randint(0, 1000)])


class WaitingThreadSafe(Waiting):
    """Declares itself thread-safe: it draws only from stoker's per-sample generators."""

    stoker_thread_safe = True

    def __getitem__(self, i: int) -> torch.Tensor:
        self._never.wait(self.wait_s)
        draw = int(stoker.sample_rng().integers(1 << 30))
        flip = int(torch.randint(1 << 30, (), generator=stoker.sample_generator()))
        return torch.tensor([i, draw, flip])


class Computing(Dataset):
    """Pure Python CPU work per sample."""

    def __len__(self) -> int:
        return 240

    def __getitem__(self, i: int) -> torch.Tensor:
        total = 0
        for k in range(3000):
            total += k * i
        return torch.tensor([i, total % 997])


class Augmenting(Dataset):
    """Random augmentations from the three global RNGs."""

    def __len__(self) -> int:
        return 45

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(
            [i, random.randint(0, 10**6), int(np.random.randint(10**6)),
             int(torch.randint(10**6, ()))]
        )


class HeadBlocked(Dataset):
    """Sample ``blocked`` waits until sample ``release_at`` (a later batch) has been fetched.

    ``blocked`` comes after the tuner's first few samples, which are always fetched one by one.
    """

    stoker_thread_safe = True

    def __init__(self, n: int = 64, blocked: int = 20, release_at: int = 40) -> None:
        self.n, self.blocked, self.release_at = n, blocked, release_at
        # Shared by forked workers: the release may happen in another worker than the wait.
        self._released = multiprocessing.get_context("fork").Event()
        self._never = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self._never.wait(0.004)  # I/O-like, so the tuner fetches concurrently
        if i == self.blocked:
            if not self._released.wait(BLOCK_S):
                raise TimeoutError(f"sample {i} was never released")
        if i == self.release_at:
            self._released.set()
        return torch.tensor(i)


class Dies(Dataset):
    """Sample ``at`` ends its worker: by a signal or an exit code."""

    def __init__(self, how: str, at: int = 9) -> None:
        self.how, self.at = how, at

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            if self.how == "SIGKILL":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "SIGSEGV":
                ctypes.string_at(0)
            else:
                os._exit(3)
        return torch.tensor(i)


class Stuck(Dataset):
    """Sample 3 blocks on an event the test sets once it has seen the stall warning."""

    def __init__(self, event: object) -> None:
        self.event = event

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 3:
            self.event.wait(BLOCK_S)  # type: ignore[attr-defined]
        return torch.tensor(i)


class Records(Dataset):
    """In-memory records read with ``int()``: the batched form read from the source applies
    (NOTE [ Batched getitem from source ]). ``bad_label`` (an index) holds NaN: ``int()`` of
    it raises for that one sample."""

    def __init__(self, n: int = 400, bad_label: int | None = None) -> None:
        gen = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 8, generator=gen)
        self.y = torch.randint(0, 10, (n,), generator=gen).float()
        self.names = [f"r{i}" for i in range(n)]
        if bad_label is not None:
            self.y[bad_label] = float("nan")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index):
        return {"x": self.x[index] * 2, "y": int(self.y[index]), "name": self.names[index]}
