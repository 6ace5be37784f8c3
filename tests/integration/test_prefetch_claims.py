"""The main process's claims on the shards it downloads for its workers (NOTE [ Claims held at
once ] in ``storage/prefetch_threads.py``), against a real S3 server: far more uncached shards
in flight than ``_MAX_CLAIMS``, and the main process never holds more lock files open than
that, while every shard is still downloaded once and every sample is exact."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from _s3_server import SERVER_NEEDS

from _optional import skip_module_unless

skip_module_unless(
    *SERVER_NEEDS,
    ("s3fs", "reading s3:// needs s3fs (test extra)"),
)

from _remote_datasets import FAST_RETRY, RECORD_BYTES, records_on_server  # noqa: E402
from _s3_server import S3Server  # noqa: E402

import stoker  # noqa: E402
from stoker.formats import TarShards, pack  # noqa: E402
from stoker.storage import open_source, prefetch_threads  # noqa: E402
from stoker.storage.prefetch_threads import _FETCH_FOR_OTHERS_THREADS  # noqa: E402

_MAX_CLAIMS = 32  # the bound these tests set, smaller than the default: fewer shards to serve
SHARDS = 5 * _MAX_CLAIMS


@pytest.fixture(autouse=True)
def _bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch_threads, "_MAX_CLAIMS", _MAX_CLAIMS)


# Counting while downloads end and claims are taken is no snapshot: a claim released and
# another taken while /proc/self/fd is read can both be counted (they were one per shard).
_RACE = _FETCH_FOR_OTHERS_THREADS


def _lock_fds(cache_dir: Path) -> int:
    """How many of this process's open files are the cache's lock files (its claims)."""
    locks = str(cache_dir / ".locks") + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own fd, closed meanwhile
            continue
        count += target.startswith(locks)
    return count


def _gets(s3: S3Server, url: str) -> int:
    return s3.faults.gets_by_path.get("/" + url.split("://", 1)[1], 0)


def test_claims_ahead_of_the_downloads_are_bounded_and_a_reader_downloads_one_not_claimed(
    tmp_path: Path,
) -> None:
    """With every download held at its start, asking for 5 x ``_MAX_CLAIMS`` shards claims
    ``_MAX_CLAIMS`` of them (one lock file each) and lines the rest up unclaimed; it used to
    claim all of them. A reader wanting a claimed shard waits for the main process's download;
    one wanting a shard still in line downloads it itself, and the main process skips it
    later: each shard one GET, every byte the store's."""
    with records_on_server(tmp_path, SHARDS, 2) as s3:
        cache_dir = tmp_path / "cache"
        sizes = {url: os.path.getsize(local)
                 for url, local in zip(s3.urls, s3.local_urls, strict=True)}
        main = open_source(s3.urls[0], storage_options=s3.storage_options, retry=FAST_RETRY,
                           cache_dir=str(cache_dir), cache_bytes=10**8, fetch="shard")
        reader = open_source(s3.urls[0], storage_options=s3.storage_options,
                             retry=FAST_RETRY, cache_dir=str(cache_dir), cache_bytes=10**8,
                             fetch="shard")  # a worker's view of the same cache
        get_into = main.get_into  # type: ignore[attr-defined]
        started = threading.Semaphore(0)
        release = threading.Event()
        done, all_done, lock = [0], threading.Event(), threading.Lock()
        claims_seen: list[int] = []

        def held_download(path: str, file: str) -> int:
            claims_seen.append(_lock_fds(cache_dir))
            started.release()
            assert release.wait(timeout=60)
            got = get_into(path, file)
            with lock:
                done[0] += 1
                if done[0] == SHARDS - 1:  # all but the one the reader downloads
                    all_done.set()
            return got

        main.get_into = held_download  # type: ignore[attr-defined]
        claimed, waiting = s3.urls[_MAX_CLAIMS - 1], s3.urls[-1]
        answers: list[bytes] = []
        try:
            main.expect_sizes(sizes)  # type: ignore[attr-defined]
            main.fetch_for_workers(list(s3.urls))  # type: ignore[attr-defined]
            for _ in range(_FETCH_FOR_OTHERS_THREADS):  # each download thread at its start
                assert started.acquire(timeout=60)
            assert _lock_fds(cache_dir) == _MAX_CLAIMS  # it was one per shard: SHARDS
            assert reader.read_range(waiting, 0, RECORD_BYTES)  # not claimed: read here
            assert _gets(s3, waiting) == 1
            waits = threading.Thread(target=lambda: answers.append(
                reader.read_range(claimed, 0, RECORD_BYTES)))
            waits.start()  # waits for the main process's download of it
            release.set()
            assert all_done.wait(timeout=120)
            waits.join(timeout=60)
            assert not waits.is_alive()
        finally:
            release.set()
            main.close()  # type: ignore[attr-defined]  # waits for downloads in flight
            reader.close()  # type: ignore[attr-defined]
        assert max(claims_seen) <= _MAX_CLAIMS + 1 + _RACE  # + the reader waiting on one
        assert _lock_fds(cache_dir) == 0
        with open(s3.local_urls[_MAX_CLAIMS - 1], "rb") as f:
            assert answers == [f.read(RECORD_BYTES)]
        cache = main.cache  # type: ignore[attr-defined]
        for url, local in zip(s3.urls, s3.local_urls, strict=True):
            assert _gets(s3, url) == 1, url
            with open(local, "rb") as a, open(cache.path_for(url), "rb") as b:
                assert a.read() == b.read(), url


class _Samples(torch.utils.data.Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return SHARDS

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"cls": i, "bin": bytes([i % 256]) * 100}


class _ClaimsSeen(TarShards):
    """Counts the main process's lock files after each batch's shards are claimed."""

    def __init__(self, *args: Any, cache_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache_dir, self.claims_seen = cache_dir, [0]

    def stoker_fetch_for_batch(self, indices: list[int]) -> None:
        super().stoker_fetch_for_batch(indices)
        self.claims_seen.append(_lock_fds(self.cache_dir))


def _label_and_byte(sample: dict[str, bytes]) -> tuple[int, int, int]:
    return int(sample["cls"]), sample["bin"][0], len(sample["bin"])


def test_a_cold_shuffled_epoch_of_many_small_shards_holds_few_claims(tmp_path: Path) -> None:
    """One sample per shard, batches of 64 through 2 workers (prefetch 2: ~256 shards in
    flight, 5 x ``_MAX_CLAIMS`` in all): the main process's lock files stay about
    ``_MAX_CLAIMS`` after every batch it sends (they grew by one per uncached shard in flight,
    and under ``ulimit -n 512`` the training loop's own ``open()`` failed), every sample comes
    once with its bytes, and each shard is downloaded once on the node."""
    packed = tmp_path / "packed"
    pack(_Samples(), str(packed), samples_per_shard=1, workers=1, progress=False)
    with S3Server() as s3:
        s3.upload_dir(str(packed), "bucket", "many")
        url = "s3://bucket/many/index.json"
        cache_dir = tmp_path / "cache"
        source = open_source(url, storage_options=s3.storage_options, retry=FAST_RETRY,
                             cache_dir=str(cache_dir), cache_bytes=10**8, fetch="shard")
        dataset = _ClaimsSeen(url, source=source, transform=_label_and_byte,
                              cache_dir=cache_dir)
        try:
            loader = stoker.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2,
                                       prefetch_factor=2, timeout=60,
                                       generator=torch.Generator().manual_seed(3))
            rows = [tuple(r) for batch in loader for r in torch.stack(batch, 1).tolist()]
        finally:
            source.close()  # type: ignore[attr-defined]
        assert Counter(rows) == Counter((i, i % 256, 100) for i in range(SHARDS))
        assert 0 < max(dataset.claims_seen) <= _MAX_CLAIMS + _RACE
        shards = {f"/bucket/many/{Path(s.path).name}" for s in dataset.shards}
        assert len(shards) == SHARDS
        assert all(s3.faults.gets_by_path.get(p) == 1 for p in shards), Counter(
            s3.faults.gets_by_path.get(p) for p in shards)
