"""``TarShardStream`` over packs: through stoker's loader with 2 worker processes the workers
split the shards and together yield each sample of the dataset exactly once per epoch; given
the pack itself, its indexes replace the tar parsing."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import torch

import stoker
from _tar_samples import draw, write_shards
from stoker.formats import ShardError, TarShards, TarShardStream, pack, tar_stream


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


def test_persistent_workers_read_the_epoch_set_in_the_main_process(tmp_path: Path) -> None:
    # Their copies were pickled when they started: stoker's loader gives each new epoch's
    # set_epoch to them (NOTE [ A dataset's epoch on persistent workers ]).
    pack(Numbers(), str(tmp_path), samples_per_shard=4, workers=1, progress=False)
    stream = TarShardStream(str(tmp_path), transform=label, shuffle_buffer=5, seed=2)
    persistent = stoker.DataLoader(stream, batch_size=3, num_workers=2, timeout=60,
                                   persistent_workers=True)
    fresh = stoker.DataLoader(stream, batch_size=3, num_workers=2, timeout=60)
    epochs = []
    for epoch in (0, 1, 5):
        stream.set_epoch(epoch)
        epochs.append([x for batch in persistent for x in batch.tolist()])
        assert epochs[-1] == [x for batch in fresh for x in batch.tolist()]
    assert epochs[0] != epochs[1] != epochs[2]
    del persistent  # its workers end with it


def test_stream_over_a_pack_uses_its_indexes_and_checks_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a pack, the stream yields what the shard list yields, in the same order, with no
    tar parsed; a shard changed in place is caught by its CRC-32s (the tar scan cannot see a
    changed payload), a cut one by its size; a pack without its file of indexes is scanned."""
    class Blobs(torch.utils.data.Dataset[dict[str, bytes]]):
        def __len__(self) -> int:
            return 23

        def __getitem__(self, i: int) -> dict[str, bytes]:
            return {"bin": bytes([i]) * (100 + i), "cls": str(i).encode()}

    out = tmp_path / "pack"
    pack(Blobs(), str(out), samples_per_shard=5, workers=1, progress=False)
    paths = TarShardStream(str(out)).shards
    assert len(paths) == 5 and all(p.endswith(".tar") for p in paths)
    scanned = [(s["__key__"], s["bin"], s["cls"])
               for s in TarShardStream(paths, shuffle_buffer=7, seed=4)]
    scans: list[str] = []
    real_scan = tar_stream.scan_bytes
    monkeypatch.setattr(tar_stream, "scan_bytes",
                        lambda view, path: scans.append(path) or real_scan(view, path))
    indexed = [(s["__key__"], s["bin"], s["cls"])
               for s in TarShardStream(str(out / "index.json"), shuffle_buffer=7, seed=4)]
    assert indexed == scanned and len(indexed) == 23 and scans == []

    table = TarShards(str(out)).table(1)
    raw = bytearray(Path(paths[1]).read_bytes())
    field = list(table.fields).index("bin")
    raw[int(table.offsets[field])] ^= 0xFF
    Path(paths[1]).write_bytes(bytes(raw))
    key = str(table.keys[0])
    with pytest.raises(ShardError) as info:
        list(TarShardStream(str(out), shuffle_buffer=0))
    assert str(info.value) == (
        f"{paths[1]}: key {key!r}, member {key}.bin: CRC-32 "
        f"{zlib.crc32(bytes(raw[int(table.offsets[field]):][:int(table.sizes[field])])):08x}, "
        f"the index says {int(table.crc32[field]):08x}: the shard was corrupted or changed "
        "after it was indexed; re-create it")
    assert len(list(TarShardStream(str(out), verify_crc=False))) == 23
    assert len(list(TarShardStream(paths))) == 23  # the scan sees a valid tar

    cut = int(table.offsets[-1] + table.sizes[-1]) - 10  # inside the last member
    Path(paths[1]).write_bytes(bytes(raw[:cut]))
    with pytest.raises(ShardError, match=f"{paths[1]}: the shard is {cut} bytes"):
        list(TarShardStream(str(out)))
    manifest = json.loads((out / "index.json").read_text())
    del manifest["tables"]
    (out / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="not a readable tar shard|truncated"):
        list(TarShardStream(str(out)))
    assert scans  # without the file of indexes, shards are scanned



def test_a_transforms_sample_rng_draws_the_same_in_workers(tmp_path: Path) -> None:
    """NOTE [ A stream's samples have no index ]: seeded per sample from the stream's seed,
    epoch, shard and key, the draws do not depend on which worker reads the sample."""
    paths = write_shards(tmp_path)
    alone = dict(TarShardStream(paths, transform=draw, shuffle_buffer=0, seed=3))
    assert sorted(alone) == list(range(15))
    stream = TarShardStream(paths, transform=draw, shuffle_buffer=4, seed=3)
    loader = stoker.DataLoader(stream, batch_size=None, num_workers=2, timeout=60)
    assert {int(i): int(d) for i, d in loader} == alone


class _DrawsInIter(torch.utils.data.IterableDataset[int]):
    def __iter__(self):
        yield int(stoker.sample_rng().integers(10))


def test_sample_rng_in_an_iterable_dataset_says_what_to_use_from_a_worker() -> None:
    loader = stoker.DataLoader(_DrawsInIter(), batch_size=2, num_workers=2, timeout=60)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    assert str(info.value) == (
        "stoker.sample_seed()/sample_rng()/sample_generator() seed from the index of the "
        "sample being loaded, and an IterableDataset's samples have none (they come out of its "
        "iterator). In an IterableDataset, make one generator per worker in __iter__, e.g. "
        "numpy.random.default_rng(torch.initial_seed()) (torch seeds each worker differently, "
        "and the main process at num_workers=0), and draw from it; or use a map-style dataset. "
        "TarShardStream's transform may call them: it seeds each sample from its shard and key."
    )
