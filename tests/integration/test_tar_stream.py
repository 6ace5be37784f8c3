"""``TarShardStream`` through stoker's loader with 2 worker processes: the workers split the
shards, and together they yield each sample of the dataset exactly once per epoch."""

from __future__ import annotations

from pathlib import Path

import torch

import stoker
from stoker.formats import TarShards, TarShardStream, pack


class Numbers(torch.utils.data.Dataset[dict[str, int]]):
    def __len__(self) -> int:
        return 29

    def __getitem__(self, i: int) -> dict[str, int]:
        return {"cls": i}


def label(sample: dict[str, bytes]) -> int:
    return int(sample["cls"])


def test_workers_split_the_shards_and_read_everything_once(tmp_path: Path) -> None:
    pack(Numbers(), str(tmp_path), samples_per_shard=4, workers=1, progress=False)
    urls = [s.path for s in TarShards(str(tmp_path)).shards]
    stream = TarShardStream(urls, transform=label, shuffle_buffer=5, seed=2)
    loader = stoker.DataLoader(stream, batch_size=3, num_workers=2, timeout=60)
    epochs = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        epochs.append([x for batch in loader for x in batch.tolist()])
        assert sorted(epochs[-1]) == list(range(29))
    assert epochs[0] != epochs[1]
