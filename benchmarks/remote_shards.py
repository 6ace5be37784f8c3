"""Reading a dataset from an S3-compatible server with 10 ms added per request: packed tar
shards through stoker against one object per sample through torch's DataLoader, same
``num_workers``, same shuffled order of samples, cold local cache.

The server is moto in server mode behind the tests' fault-injecting proxy
(``tests/integration/_s3_server.py``), which adds the latency; everything runs on this machine,
so the network is loopback and the proxy shares the CPUs with the loaders.

    .venv/bin/python benchmarks/remote_shards.py [--samples 1000] [--workers 2]

Each loader reads the raw JPEG bytes (no decode: this isolates the storage path) and returns
their length. Prints one JSON record per loader and the ratio against torch's, plus
``network_bound``: the shards fetched whole, ``--workers`` GETs at a time, by a connected
client (the ceiling for reading these bytes here); each record's ``fraction_of_network_bound``
compares against it. Every loader's epoch starts cold (clients, manifest, indexes included).
Also ``stoker_stream`` (``TarShardStream``: whole shards in order through the cache, a
1,000-sample buffer) and the peer ``webdataset_http`` (webdataset over presigned HTTP URLs,
its curl pipe, through the same proxy, in torch's DataLoader), when webdataset is installed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))
from _harness import machine_info  # noqa: E402
from _s3_server import S3Server  # noqa: E402

import stoker  # noqa: E402
from stoker.formats import TarShards, TarShardStream, pack  # noqa: E402
from stoker.storage import open_source  # noqa: E402


def write_folder(root: Path, n: int, classes: int = 10) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        img = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        rel = f"c{i % classes}/{i:06d}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(buf.getvalue())
        names.append(rel)
    return names


class PerFile(Dataset):
    """One object per sample, one GET each (what a Dataset over a bucket of files does)."""

    def __init__(self, urls: list[str], options: dict[str, Any]) -> None:
        self.urls = urls
        self.source = open_source(urls[0], storage_options=options, fetch="range")

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> int:
        return len(self.source.read(self.urls[i]))


def _jpg_len(sample: dict[str, Any]) -> int:
    return len(sample["jpg"])


def network_bound(urls: list[str], options: dict[str, Any], samples: int,
                  workers: int) -> dict[str, Any]:
    """What the server gives: every shard fetched whole, ``workers`` GETs at a time, by one
    client already connected (its creation is not counted). Reading the same bytes faster is
    not possible here, so it is the ceiling for the packed readers (raw bytes: no decode
    bound applies)."""
    from concurrent.futures import ThreadPoolExecutor

    source = open_source(urls[0], storage_options=options, fetch="range")
    source.size(urls[0])  # connect
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        total = sum(len(b) for b in pool.map(source.get_whole, urls))  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    source.close()  # type: ignore[attr-defined]
    return {"loader": "network_bound", "samples": samples, "epoch_s": round(elapsed, 3),
            "samples_per_s": round(samples / elapsed, 1), "mb_per_s":
            round(total / elapsed / 1e6, 2), "gets": len(urls)}


def webdataset_http(endpoint: str, shard_names: list[str], args: Any) -> Any:
    """The peer on the same shards: webdataset's pipeline (shard shuffle + 1,000-sample
    buffer) over HTTP GETs of presigned URLs (its curl pipe, through the same proxy), in
    torch's DataLoader with the same workers. None when webdataset is not installed."""
    try:
        import boto3
        import webdataset as wds
    except ImportError:
        return None
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    urls = [client.generate_presigned_url("get_object", ExpiresIn=3600, Params={
        "Bucket": "bench", "Key": f"packed/{n}"}) for n in shard_names]
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None,
                              empty_check=False).shuffle(1000).map(_jpg_len))
    return TorchDataLoader(dataset, batch_size=args.batch, num_workers=args.workers)


def run(name: str, make_loader) -> dict[str, Any]:
    start = time.perf_counter()
    loader = make_loader()
    first = None
    samples = total_bytes = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        samples += len(batch)
        total_bytes += int(batch.sum())
    elapsed = time.perf_counter() - start
    return {"loader": name, "samples": samples, "epoch_s": round(elapsed, 3),
            "samples_per_s": round(samples / elapsed, 1),
            "time_to_first_batch_s": round(first or 0.0, 3),
            "mb_per_s": round(total_bytes / elapsed / 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stoker-remote-bench-"))
    names = write_folder(tmp / "files", args.samples)
    pack(str(tmp / "files"), str(tmp / "packed"), samples_per_shard=args.per_shard,
         workers=1, progress=False)
    with S3Server() as s3:
        s3.upload_dir(str(tmp / "files"), "bench", "files")
        s3.upload_dir(str(tmp / "packed"), "bench", "packed")
        s3.faults.latency_s = args.latency_ms / 1e3
        options = s3.storage_options
        urls = [f"s3://bench/files/{n}" for n in names]
        common = {"batch_size": args.batch, "shuffle": True, "num_workers": args.workers}
        results = []

        def torch_files():
            return TorchDataLoader(PerFile(urls, options), generator=torch.Generator()
                                   .manual_seed(0), **common)

        def stoker_shards(fetch: str, cache: str):
            def make():
                disk = {"cache_dir": cache, "cache_bytes": 1 << 30} if fetch == "shard" else {}
                source = open_source("s3://bench/packed/index.json", storage_options=options,
                                     fetch=fetch, **disk)
                ds = TarShards("s3://bench/packed/index.json", source=source, transform=_jpg_len)
                if fetch == "shard":  # the order shards are read in: fetch ahead
                    source.plan([s.path for s in ds.shards])  # type: ignore[attr-defined]
                return stoker.DataLoader(ds, generator=torch.Generator().manual_seed(0),
                                         **common)
            return make

        def stoker_files():
            return stoker.DataLoader(PerFile(urls, options),
                                     generator=torch.Generator().manual_seed(0), **common)

        gets0 = s3.faults.gets
        results.append(run("torch_per_file", torch_files) | {"gets": s3.faults.gets - gets0})
        for name, make in [("stoker_packed_shards", stoker_shards("shard", str(tmp / "c1"))),
                           ("stoker_packed_ranges", stoker_shards("range", str(tmp / "c2"))),
                           ("stoker_per_file", stoker_files)]:
            gets0 = s3.faults.gets
            results.append(run(name, make) | {"gets": s3.faults.gets - gets0})
        listing = open_source("s3://bench/packed/index.json", storage_options=options)
        shard_urls = [s.path for s in TarShards("s3://bench/packed/index.json",
                                                source=listing).shards]
        listing.close()  # type: ignore[attr-defined]

        def stoker_stream():
            source = open_source(shard_urls[0], storage_options=options, fetch="shard",
                                 cache_dir=str(tmp / "c3"), cache_bytes=1 << 30)
            stream = TarShardStream(shard_urls, source=source, transform=_jpg_len,
                                    shuffle_buffer=1000)
            return stoker.DataLoader(stream, batch_size=args.batch, num_workers=args.workers)

        gets0 = s3.faults.gets
        results.append(run("stoker_stream", stoker_stream) | {"gets": s3.faults.gets - gets0})
        web = webdataset_http(s3.endpoint_url, [u.rsplit("/", 1)[1] for u in shard_urls], args)
        if web is not None:
            gets0 = s3.faults.gets
            results.append(run("webdataset_http", lambda: web) | {"gets": s3.faults.gets - gets0})
        results.append(network_bound(shard_urls, options, args.samples, args.workers))
    base = results[0]["samples_per_s"]
    bound = results[-1]["samples_per_s"]
    for record in results:
        record |= {"workload": "remote_shards", "latency_ms": args.latency_ms,
                   "num_workers": args.workers, "speedup_vs_torch_per_file":
                   round(record["samples_per_s"] / base, 2), "fraction_of_network_bound":
                   round(record["samples_per_s"] / bound, 3), "machine": machine_info()}
        print(json.dumps(record))
    os.system(f"rm -rf {tmp}")


if __name__ == "__main__":
    main()
