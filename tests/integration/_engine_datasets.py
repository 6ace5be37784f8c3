"""Datasets for the engine-feature tests (module level, so they pickle for any start method)."""

from __future__ import annotations

import ctypes
import mmap
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


class WaitingDeclared(Waiting):
    """Waiting, and its class promises that __getitem__ may run on several threads."""

    stoker_thread_safe = True


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

    Passing needs the samples from ``blocked`` to ``release_at`` fetched at once: the test sets
    ``worker_concurrency`` (a tuned one depends on the machine's load).
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


class HoldsTheGil(Dataset):
    """Sample 3 (worker 1's) waits in a C call that keeps the GIL: ``system`` through
    ``ctypes.PyDLL``. Its shell opens the FIFO ``entered``, which lets sample 0 (worker 0's)
    go on, so the loader's first batch comes once worker 1 holds the GIL; then it waits for a
    line on the FIFO ``release``."""

    def __init__(self, entered: str, release: str) -> None:
        self.entered, self.release = entered, release

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 0:
            with open(self.entered):  # until sample 3's shell opens it
                pass
        if i == 3:
            shell = f"echo > '{self.entered}'; read line < '{self.release}'"
            ctypes.PyDLL(None).system(shell.encode())
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


class QueuedBehindSlow(Dataset):
    """Batch ``slow`` waits until ``release_after`` samples of other batches were loaded.

    With ``num_workers=2`` and ``prefetch_factor=3``, 6 batches are all sent at the start,
    task k to worker k % 2: worker 0 holds batches 0, 2 and 4, so batch 4 queues behind the
    slow batch 2. Released after every other sample (the default), the epoch ends only if
    worker 1 takes batch 4 over. Each sample returns ``[index, worker id, a draw from torch's
global RNG]``; ``loads`` counts
    the loads of each index in every process (forked workers only: the counts live in an
    anonymous shared mapping).
    """

    def __init__(self, n: int = 24, batch_size: int = 4, slow: int = 2,
                 release_after: int | None = None) -> None:
        ctx = multiprocessing.get_context("fork")
        self.n, self.batch_size, self.slow = n, batch_size, slow
        self.release_after = n - batch_size if release_after is None else release_after
        self._counts = mmap.mmap(-1, 4 * (n + 1))  # loads per index, then other samples loaded
        self._lock = ctx.Lock()
        self.released = ctx.Event()
        self.reloaded = ctx.Event()  # a batch's last index was loaded a second time

    @property
    def loads(self) -> np.ndarray:
        return np.frombuffer(self._counts, dtype=np.int32)[: self.n]

    def __len__(self) -> int:
        return self.n

    def rearm(self) -> None:
        """Block batch ``slow`` again (next epoch)."""
        with self._lock:
            np.frombuffer(self._counts, dtype=np.int32)[self.n] = 0
        self.released.clear()

    def __getitem__(self, i: int) -> torch.Tensor:
        if not isinstance(i, int):  # stoker's batched-call probe: not counted as loads
            raise TypeError("one index at a time")
        info = torch.utils.data.get_worker_info()
        counts = np.frombuffer(self._counts, dtype=np.int32)
        with self._lock:
            counts[i] += 1
            if counts[i] == 2 and i % self.batch_size == self.batch_size - 1:
                self.reloaded.set()
            if i // self.batch_size != self.slow:
                counts[self.n] += 1
                if counts[self.n] == self.release_after:
                    self.released.set()
        if i // self.batch_size == self.slow and i % self.batch_size == 0:
            if not self.released.wait(BLOCK_S):
                raise TimeoutError(f"sample {i} was never released")
        draw = int(torch.randint(1 << 30, ()))  # an augmentation from the global RNG
        return torch.tensor([i, info.id if info is not None else -1, draw])


class Gated(Dataset):
    """Sample ``i`` (in ``gated``) tells ``started`` and waits for ``gate`` before loading."""

    def __init__(self, n: int = 8, gated: tuple[int, ...] = (0,)) -> None:
        ctx = multiprocessing.get_context("fork")
        self.n, self.gated = n, gated
        self.started, self.gate = ctx.Event(), ctx.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.gated:
            self.started.set()
            if not self.gate.wait(BLOCK_S):
                raise TimeoutError(f"sample {i} was never let through")
        return torch.tensor(i)


class GatedBig(Dataset):
    """2 MiB samples; sample ``gated`` waits for ``gate`` (set by the test's main process)."""

    def __init__(self, n: int = 4, gated: int = 1) -> None:
        self.n, self.gated = n, gated
        self.gate = multiprocessing.get_context("fork").Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.gated and not self.gate.wait(BLOCK_S):
            raise TimeoutError(f"sample {i} was never let through")
        return torch.full((1 << 19,), float(i))
