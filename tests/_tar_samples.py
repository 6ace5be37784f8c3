"""Small tar shards and a transform that draws from ``stoker.sample_rng()``: what the tests of
a stream's per-sample randomness share (unit and integration)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import stoker


def write_shards(root: Path, shards: int = 3, per_shard: int = 5) -> list[str]:
    """``shards`` tar files of ``per_shard`` samples each: keys unique, ``cls`` 0, 1, 2..."""
    paths = []
    for s in range(shards):
        path = root / f"s{s}.tar"
        with tarfile.open(path, "w") as tar:
            for j in range(per_shard):
                data = str(s * per_shard + j).encode()
                info = tarfile.TarInfo(f"{s:02d}{j:03d}.cls")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def draw(sample: dict[str, bytes]) -> tuple[int, int]:
    """A sample's label and one draw from its ``sample_rng()``."""
    return int(sample["cls"]), int(stoker.sample_rng().integers(1 << 40))
