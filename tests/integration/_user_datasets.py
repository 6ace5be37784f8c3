"""Datasets written the way users write them, correct under torch's DataLoader, that a loader
must not break with defaults (issue 17): none declares ``stoker_thread_safe``."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import threading
from typing import Any

import torch
from torch.utils.data import Dataset

RECORD_BYTES = 64
LATENCY_S = 0.004  # a remote read's round trip: the fetches mostly wait


def _latency(seconds: float = LATENCY_S) -> None:
    threading.Event().wait(seconds)


def write_records(path: str, n: int) -> None:
    """``n`` fixed-size records, record ``i`` filled with its own index."""
    with open(path, "wb") as f:
        for i in range(n):
            f.write(i.to_bytes(4, "little") * (RECORD_BYTES // 4))


class RecordFile(Dataset):
    """One seekable handle per process, read with seek + read (as fsspec/FUSE readers do)."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n
        self._file: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._pid != os.getpid():  # opened lazily: a handle is not shared across fork
            self._file, self._pid = open(self.path, "rb"), os.getpid()
        self._file.seek(i * RECORD_BYTES)
        _latency()  # the request is in flight
        data = self._file.read(RECORD_BYTES)
        return torch.frombuffer(bytearray(data), dtype=torch.int32)


def write_sqlite(path: str, n: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE samples (id INTEGER PRIMARY KEY, value INTEGER)")
        db.executemany("INSERT INTO samples VALUES (?, ?)", [(i, 7 * i) for i in range(n)])
    db.close()


class SqliteRows(Dataset):
    """The connection is opened on first use (sqlite3 connections do not survive fork)."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n = path, n
        self._db: sqlite3.Connection | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self._db is None:
            self._db = sqlite3.connect(self.path)
        _latency()  # the database lives on a network filesystem
        (value,) = self._db.execute("SELECT value FROM samples WHERE id = ?", (i,)).fetchone()
        return value


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout("download took too long")


class AlarmGuarded(Dataset):
    """A download with a SIGALRM timeout around it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(30)
        try:
            _latency()  # the download
            return i
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


class LateJitter(Dataset):
    """I/O-bound; from sample ``late`` on, a retry sleeps a random jitter drawn from ``random``."""

    def __init__(self, n: int = 160, late: int = 80) -> None:
        self.n, self.late = n, late

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        _latency()
        if i < self.late:
            return torch.tensor([i, 0])
        jitter_us = random.randint(1, 10**6)  # retry-with-jitter
        return torch.tensor([i, jitter_us])


class BatchNormalised(Dataset):
    """Normalises a sample by its largest magnitude: applied to a tensor of indices, the max
    is taken over the whole batch, not per sample."""

    def __init__(self, n: int = 1024, dim: int = 8, clean: int = 512) -> None:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, dim, generator=gen)
        # The first ``clean`` rows happen to be normalised already (max magnitude 1), so a
        # whole batch of them gives the same either way; the rest are not.
        x[:clean] /= x[:clean].abs().amax(dim=1, keepdim=True)
        x[clean:] *= torch.arange(2, n - clean + 2).unsqueeze(1)
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: Any) -> torch.Tensor:
        x = self.x[i]
        return x / x.abs().max()


class Labelled(Dataset):
    """70k labels in a plain list the user's script also holds (e.g. to fix them up)."""

    def __init__(self, labels: list) -> None:
        self.labels = labels

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return type(self.labels[i]).__name__, self.labels[i]


class ListUser(Dataset):
    """Uses its list the ways a list is used: copies, concatenation, repetition, str()."""

    def __init__(self, n: int = 70_000) -> None:
        self.files = [f"shard_{k:05d}.tar" for k in range(n)]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        mine = self.files.copy()
        mine.append("extra.tar")
        both = self.files + ["tail.tar"]
        front = ["head.tar"] + self.files
        twice = self.files * 2
        text = str(self.files)
        self.files.append(f"cache_{i}.tar")  # the worker's own copy grows, as under torch
        grown = len(self.files)
        self.files.pop()
        return (len(mine), both[-1], front[0], len(twice), len(text), hash(text), grown,
                self.files == sorted(self.files), self.files < self.files + ["z"])
