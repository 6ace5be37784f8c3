"""Datasets read from ``gs://`` URLs (gcsfs) from a real GCS JSON API over HTTP (an emulator
behind the fault proxy): ``TarShards`` by whole shards through the cache and by ranged reads,
``TarShardStream`` over a pack, each equal to the local copy; transient faults retried by
stoker's policy alone (gcsfs's own retries would multiply its attempts and ignore its delays),
a refused read not retried, a read that keeps failing named."""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from _optional import skip_module_unless

skip_module_unless(
    ("gcsfs", "reading gs:// needs gcsfs (gcs extra)"),
    ("gcp_storage_emulator", "the GCS tests' server (test extra)"),
)

from _gcs_server import GCSServer  # noqa: E402
from _remote_datasets import LabelAndClient, epoch_samples  # noqa: E402
from test_tar_stream import Numbers, label  # noqa: E402

import stoker  # noqa: E402
from stoker.errors import RemoteReadError, ShardError  # noqa: E402
from stoker.formats import TarShards, TarShardStream, pack  # noqa: E402
from stoker.storage import RetryPolicy, open_source  # noqa: E402

FAST_RETRY = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05)
URL = "gs://bench/packed/index.json"


@pytest.fixture
def gcs(tmp_path: Path):
    pack(Numbers(), str(tmp_path / "packed"), samples_per_shard=4, workers=1, progress=False)
    with GCSServer() as server:
        server.upload_dir(str(tmp_path / "packed"), "bench", "packed")
        yield server


def _labels(dataset: Any, **kwargs: Any) -> list[Any]:
    return epoch_samples(stoker.DataLoader(dataset, batch_size=5, num_workers=2, timeout=60,
                                           **kwargs))


def _shard_gets(gcs: GCSServer, name: str) -> int:
    return sum(n for path, n in gcs.faults.gets_by_path.items() if path.endswith(f"%2F{name}"))


@pytest.mark.parametrize("fetch", ["shard", "range"])
def test_tar_shards_over_gcs_equal_the_local_ones(gcs, tmp_path, fetch, caplog) -> None:
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_bytes": 10**7} if fetch == "shard" \
        else {}
    source = open_source(URL, storage_options=gcs.storage_options, retry=FAST_RETRY,
                         fetch=fetch, **cache)
    remote = TarShards(URL, source=source, transform=LabelAndClient(source))
    local = TarShards(str(tmp_path / "packed"), transform=label)
    shuffled = {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
    shuffled_again = {"shuffle": True, "generator": torch.Generator().manual_seed(3)}
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        try:
            got = _labels(remote, **shuffled)
        finally:
            source.close()  # type: ignore[attr-defined]
        del remote, source
        gc.collect()
    assert not caplog.records  # the session closed, not destroyed pending
    assert [int(x) for x, _ in got] == _labels(local, **shuffled_again)
    names = [Path(s.path).name for s in local.shards]
    if fetch == "shard":  # each shard once, downloaded by the main process
        assert [_shard_gets(gcs, n) for n in names] == [1] * len(names)
        assert not any(c for _, c in got)
    else:  # a ranged GET per sample, by the workers
        assert sum(_shard_gets(gcs, n) for n in names) == len(local)


@pytest.mark.parametrize("fault", ["status", "reset", "truncate"])
def test_a_transient_fault_over_gcs_is_retried_by_stokers_policy_alone(gcs, fault) -> None:
    source = open_source(URL, storage_options=gcs.storage_options, retry=FAST_RETRY,
                         fetch="range")
    try:
        dataset = TarShards(URL, source=source, transform=label)
        name = Path(dataset.shards[2].path).name
        gcs.faults.fail(fault, match=name, times=1)
        assert dataset[10] == 10  # shard 2 holds samples 8..11; "10": two bytes to cut
        assert _shard_gets(gcs, name) == 2  # the failed GET and ours; none of gcsfs's own
        gcs.faults.fail("status", match=name, times=-1)
        with pytest.raises(ShardError, match=rf"{name}.*after 3 attempt\(s\).*503") as info:
            dataset[11]
        assert isinstance(info.value.__cause__, RemoteReadError)
        assert _shard_gets(gcs, name) == 2 + FAST_RETRY.attempts
    finally:
        source.close()  # type: ignore[attr-defined]


def test_a_refused_read_over_gcs_is_not_retried(gcs) -> None:
    source = open_source(URL, storage_options=gcs.storage_options, retry=FAST_RETRY,
                         fetch="range")
    try:
        dataset = TarShards(URL, source=source, transform=label)
        name = Path(dataset.shards[1].path).name
        gcs.faults.fail("status", match=name, times=-1, status=403)
        refused = rf"{name}.*permanent error, not retried: OSError: Forbidden"
        with pytest.raises(ShardError, match=refused):
            dataset[5]
        assert _shard_gets(gcs, name) == 1
    finally:
        source.close()  # type: ignore[attr-defined]


def test_a_stream_over_a_gcs_pack_with_faults_equals_the_local_one(gcs, tmp_path) -> None:
    source = open_source(URL, storage_options=gcs.storage_options, retry=FAST_RETRY,
                         fetch="shard", cache_dir=str(tmp_path / "cache"), cache_bytes=10**7)
    options = {"shuffle_buffer": 6, "seed": 5}
    remote = TarShardStream(URL, source=source, transform=label, **options)
    for fault in ("status", "reset", "truncate"):
        gcs.faults.fail(fault, match=".tar", times=1)
    try:
        got = _labels(remote)
    finally:
        source.close()  # type: ignore[attr-defined]
    assert got == _labels(TarShardStream(str(tmp_path / "packed"), transform=label, **options))
    assert sorted(got) == list(range(29))
    assert gcs.faults.injected == 3
