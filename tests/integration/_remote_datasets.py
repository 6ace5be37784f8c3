"""Datasets over objects read through a ByteSource, for the object-storage tests.

``Records`` is the smallest possible packed layout (not a format: fixed-size records laid end
to end in a few objects), so that these tests exercise the source, its retries and its cache
without depending on a record format. Record ``i`` holds its own index, so a test can count
exactly which samples an epoch yielded.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker.storage import ByteSource, RetryPolicy

RECORD_BYTES = 256
FAST_RETRY = RetryPolicy(attempts=5, base_delay_s=0.01, max_delay_s=0.05)  # tests' retries


def write_records(directory: str, shards: int, per_shard: int, seed: int = 0) -> list[str]:
    """``shards`` files of ``per_shard`` records each; returns their names, in order."""
    rng = np.random.default_rng(seed)
    names = []
    for s in range(shards):
        parts = []
        for j in range(per_shard):
            index = s * per_shard + j
            payload = rng.integers(0, 256, RECORD_BYTES - 8, dtype=np.uint8).tobytes()
            parts.append(index.to_bytes(8, "little") + payload)
        name = f"shard-{s:04d}.bin"
        with open(os.path.join(directory, name), "wb") as f:
            f.write(b"".join(parts))
        names.append(name)
    return names


@contextlib.contextmanager
def records_on_server(tmp_path: Path, shards: int, per_shard: int) -> Iterator[Any]:
    """``write_records`` under ``tmp_path/local``, uploaded to a fresh S3 server (moto behind
    the fault proxy) as ``s3://bucket/data/``; the server also names the objects by
    ``urls`` and their local copies by ``local_urls``."""
    from _s3_server import S3Server

    local = tmp_path / "local"
    local.mkdir()
    names = write_records(str(local), shards, per_shard)
    server = S3Server()
    try:
        server.upload_dir(str(local), "bucket", "data")
        server.local_urls = [str(local / n) for n in names]  # type: ignore[attr-defined]
        server.urls = [f"s3://bucket/data/{n}" for n in names]  # type: ignore[attr-defined]
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def on_small_disk(path: Path, size: str = "32k") -> Iterator[Path]:
    """A real filesystem of ``size`` (tmpfs) at ``path``, where a cache larger than it runs
    out of disk; skips the test where mounting is not allowed."""
    import subprocess

    import pytest

    path.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                  str(path)], capture_output=True, timeout=30)
    except FileNotFoundError:  # no mount command
        pytest.skip("cannot mount a tmpfs here: no `mount` command")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def record_indices(batches: list[list[int]]) -> Counter:
    """How often each record index came in batches of ``[indices..., CRCs...]`` rows."""
    return Counter(i for b in batches for i in b[: len(b) // 2])


class Records(Dataset):
    """Sample ``i``: (its index, the CRC-32 of its payload), read with one ranged read."""

    def __init__(self, source: ByteSource, urls: list[str], per_shard: int) -> None:
        self.source, self.urls, self.per_shard = source, list(urls), per_shard

    def __len__(self) -> int:
        return len(self.urls) * self.per_shard

    def __getitem__(self, i: int) -> torch.Tensor:
        s, j = divmod(i, self.per_shard)
        data = self.source.read_range(self.urls[s], j * RECORD_BYTES, RECORD_BYTES)
        index = int.from_bytes(data[:8], "little")
        return torch.tensor([index, zlib.crc32(data[8:])], dtype=torch.int64)


class LabelAndClient:
    """A packed ``Numbers`` sample's label, and whether the process reading it opened its own
    client to the store (NOTE [ The main process fetches for its workers ])."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __call__(self, sample: dict[str, bytes]) -> tuple[int, bool]:
        return int(sample["cls"]), self.source.connected


def epoch_samples(loader: Any) -> list[Any]:
    """One epoch's samples in order: ``(label, connected)`` pairs for a dataset transformed
    by ``LabelAndClient`` (its batches collate to two lists), else the labels."""
    return [x for batch in loader for x in
            (zip(*batch, strict=True) if isinstance(batch, list) else batch.tolist())]
