"""Datasets read from ``http://`` URLs (any web server or CDN: fsspec's HTTP filesystem over
aiohttp) from a real HTTP server with byte ranges: ``TarShards`` by whole shards through the
cache and by ranged reads, and ``TarShardStream`` over a pack, each equal to the local copy,
with each shard fetched once; a missing object is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("aiohttp", reason="reading http:// needs aiohttp (remote extra)")

from _http_server import HTTPFiles  # noqa: E402
from _remote_datasets import LabelAndClient, epoch_samples  # noqa: E402
from test_tar_stream import Numbers, label  # noqa: E402

import stoker  # noqa: E402
from stoker.formats import TarShards, TarShardStream, pack  # noqa: E402
from stoker.storage import RetryPolicy, open_source  # noqa: E402

FAST_RETRY = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture
def served(tmp_path: Path):
    pack(Numbers(), str(tmp_path / "packed"), samples_per_shard=4, workers=1, progress=False)
    with HTTPFiles(str(tmp_path)) as server:
        yield server


def _labels(dataset: Any, **kwargs: Any) -> list[Any]:
    return epoch_samples(stoker.DataLoader(dataset, batch_size=5, num_workers=2, timeout=60,
                                           **kwargs))


@pytest.mark.parametrize("fetch", ["shard", "range"])
def test_tar_shards_over_http_equal_the_local_ones(served, tmp_path, fetch) -> None:
    url = f"{served.url}/packed/index.json"
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 10**7} if fetch == "shard" \
        else {}
    source = open_source(url, retry=FAST_RETRY, fetch=fetch, **cache)
    remote = TarShards(url, source=source, transform=LabelAndClient(source))
    local = TarShards(str(tmp_path / "packed"), transform=label)
    shuffled = {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
    shuffled_again = {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
    try:
        got = _labels(remote, **shuffled)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert [int(x) for x, _ in got] == _labels(local, **shuffled_again)
    shards = [f"/packed/{Path(s.path).name}" for s in local.shards]
    if fetch == "shard":  # each shard once, downloaded by the main process
        assert all(served.gets[p] == 1 for p in shards)
        assert not any(c for _, c in got)
    else:  # a ranged GET per sample, by the workers
        assert sum(served.gets.get(p, 0) for p in shards) == len(local)


def test_a_stream_over_an_http_pack_equals_the_local_one(served, tmp_path) -> None:
    url = f"{served.url}/packed/index.json"
    source = open_source(url, retry=FAST_RETRY, fetch="shard",
                         cache_dir=str(tmp_path / "cache"), cache_bytes=10**7)
    options = {"shuffle_buffer": 6, "seed": 5}
    remote = TarShardStream(url, source=source, transform=label, **options)
    try:
        got = _labels(remote)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert got == _labels(TarShardStream(str(tmp_path / "packed"), transform=label, **options))
    assert sorted(got) == list(range(29))
    shards = [f"/packed/{Path(s.path).name}" for s in TarShards(str(tmp_path / "packed")).shards]
    assert all(served.gets[p] == 1 for p in shards)


def test_a_missing_object_over_http_is_named(served) -> None:
    url = f"{served.url}/packed/nope.json"
    source = open_source(url, retry=FAST_RETRY)
    try:
        with pytest.raises(FileNotFoundError) as info:
            TarShards(url, source=source)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert url in str(info.value)
