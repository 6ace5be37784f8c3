"""Reading a dataset from an S3-compatible server with 10 ms added per request: packed tar
shards through stoker against one object per sample through torch's DataLoader, same
``num_workers``, same shuffled order of samples, cold local cache, and against the streaming
peers on the same samples.

The server is moto in server mode behind the tests' fault-injecting proxy
(``tests/integration/_s3_server.py``), which adds the latency, in a process of its own;
everything runs on this machine, so the network is loopback and the server shares the CPUs
with the loaders: each record says the CPU seconds the loader's processes (``loader_cpu_s``)
and the server (``server_cpu_s``) used. The server's Python is one GIL: about one core.

    .venv/bin/python benchmarks/remote_shards.py [--samples 3000] [--workers 2] [--decode]

Each loader reads the raw JPEG bytes and returns their length (this isolates the storage
path), or with ``--decode`` a random 224x224 crop of the decoded image. Every loader's epoch
starts cold (clients, manifest, indexes, an empty cache). Each loader runs two epochs: one
timed, one sampling memory (reading PSS costs CPU). One JSON record per loader: samples/s over
the epoch and after its first batch (``steady``), time to the first batch, GETs, the CPU seconds
of its processes and of the server, the peak PSS its processes added, and the ratio against
torch's per-file loader (which reads a shuffled subset of ``--per-file-limit`` files: its rate
does not depend on the dataset's size).
Bounds: ``network_bound`` (every shard fetched whole by a connected client, at the best of
2-16 GETs at a time) and, with ``--decode``, ``decode_bound`` (the transform on bytes in memory,
one core's rate times ``--workers``); ``steady_fraction_of_bound`` compares against the smaller.
With ``--decode`` also ``shared_cpu_ceiling``: the decode plus the server's CPU per sample on
this machine's cores (the server shares them), the most any loader could reach here.
Loaders: stoker's ``TarShards`` by whole shards (``stoker_packed_shards``) and by ranges,
``TarShardStream`` (whole shards in order, a 1,000-sample buffer) over the pack's indexes
(``stoker_stream``) and over the bare shard list, each shard's tar parsed
(``stoker_stream_unindexed``: plain WebDataset shards), the first two again with
``client="obstore"`` when obstore is installed (``*_obstore``), and the peers (bytes only):
``webdataset_http`` (presigned HTTP URLs, its curl pipe, torch's DataLoader) and those of
``remote_peers.py`` (litdata, mosaicml-streaming), each when installed.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import io
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))
import remote_peers  # noqa: E402
from _harness import machine_info  # noqa: E402
from _s3_server import S3Server, S3ServerProcess  # noqa: E402

import stoker  # noqa: E402
from stoker.cli.demo import TreeMemorySampler, tree_pss_bytes  # noqa: E402
from stoker.formats import TarShards, TarShardStream, pack  # noqa: E402
from stoker.storage import open_source  # noqa: E402

# stoker's S3 clients here: s3fs always, obstore (client="obstore") when installed.
CLIENTS = ("fsspec",) + (("obstore",) if importlib.util.find_spec("obstore") else ())


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


def _jpg_len(sample: dict[str, Any]) -> int:
    return len(sample["jpg"])


_RNG = np.random.default_rng()


def _decoded(sample: dict[str, Any]) -> torch.Tensor:
    """``--decode``: what an image pipeline does with the bytes (RandomResizedCrop(224) +
    flip into a uint8 CHW tensor, stoker's fast image path)."""
    from stoker.image import decode_crop_into

    out = torch.empty((3, 224, 224), dtype=torch.uint8)
    decode_crop_into(sample["jpg"], out, _RNG)
    return out


class PerFile(Dataset):
    """One object per sample, one GET each (what a Dataset over a bucket of files does)."""

    def __init__(self, urls: list[str], options: dict[str, Any], decode: bool) -> None:
        self.urls, self.decode = urls, decode
        self.source = open_source(urls[0], storage_options=options, fetch="range")

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> Any:
        data = self.source.read(self.urls[i])
        return _decoded({"jpg": data}) if self.decode else len(data)


def network_bound(urls: list[str], options: dict[str, Any], samples: int,
                  server_cpu: Callable[[], float]) -> dict[str, Any]:
    """What the server gives: every shard fetched whole by one client already connected
    (its creation is not counted), at the best of several concurrencies and of the clients
    installed (``CLIENTS``). Reading the same bytes faster is not possible here: the ceiling
    for the packed readers."""
    from concurrent.futures import ThreadPoolExecutor

    best: dict[str, Any] = {}
    for client in CLIENTS:
        source = open_source(urls[0], storage_options=options, fetch="range", client=client)
        source.size(urls[0])  # connect
        for threads in (2, 4, 8, 16):
            cpu, server = _cpu_s(), server_cpu()
            start = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                total = sum(len(b) for b in pool.map(source.get_whole, urls))  # type: ignore
            elapsed = time.perf_counter() - start
            cpu, server = _cpu_s() - cpu, server_cpu() - server
            if not best or samples / elapsed > best["samples_per_s"]:
                best = {"loader": "network_bound", "samples": samples,
                        "epoch_s": round(elapsed, 3), "samples_per_s": round(samples / elapsed, 1),
                        "mb_per_s": round(total / elapsed / 1e6, 2), "gets": len(urls),
                        "concurrent_gets": threads, "client": client,
                        "loader_cpu_s": round(cpu, 2), "server_cpu_s": round(server, 2)}
        source.close()  # type: ignore[attr-defined]
    return best


def decode_bound(folder: Path, names: list[str], workers: int) -> dict[str, Any]:
    """``--decode``: the transform alone over bytes in memory, one core, times ``workers``
    (perfect scaling: a ceiling no loader reaches on a machine that also runs the server)."""
    blobs = [(folder / n).read_bytes() for n in names[:500]]
    _decoded({"jpg": blobs[0]})
    start = time.perf_counter()
    for blob in blobs:
        _decoded({"jpg": blob})
    per_core = len(blobs) / (time.perf_counter() - start)
    return {"loader": "decode_bound", "samples_per_s": round(per_core * workers, 1),
            "per_core_samples_per_s": round(per_core, 1)}


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


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (a loader's workers, once done)."""
    me, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _epoch(make_loader: Callable[[], Iterable[Any]]) -> tuple[float, float, int, int, int]:
    """One cold epoch: (seconds, seconds to the first batch, its size, samples, bytes)."""
    start = time.perf_counter()
    loader = make_loader()
    first, first_samples = 0.0, 0
    samples = total_bytes = 0
    for batch in loader:
        if not first_samples:
            first, first_samples = time.perf_counter() - start, len(batch)
        samples += len(batch)
        if batch.ndim == 1:
            total_bytes += int(batch.sum())
    elapsed = time.perf_counter() - start
    del loader
    gc.collect()  # a loader's workers are joined (and their CPU counted) once it is gone
    return elapsed, first, first_samples, samples, total_bytes


def run(name: str, make_loader: Callable[[], Iterable[Any]],
        exclude: Collection[int] = (), after_epoch: Callable[[], None] = lambda: None
        ) -> dict[str, Any]:
    """Two cold epochs. The first is timed: samples/s over all of it, time to the first
    batch, the rate after it (steady), the CPU seconds the loader's processes used. The second
    samples memory: the peak PSS the loader's processes added to this process tree but
    ``exclude`` (the server); reading PSS costs CPU, so that epoch is not timed.
    ``after_epoch`` runs after each (removing the epoch's cache)."""
    gc.collect()
    cpu = _cpu_s()
    elapsed, first, first_samples, samples, total_bytes = _epoch(make_loader)
    cpu = _cpu_s() - cpu
    after_epoch()
    with TreeMemorySampler(interval_s=0.05, exclude=exclude) as memory:
        before = tree_pss_bytes(exclude=exclude)
        _epoch(make_loader)
        peak = memory.peak_mib * 2**20
    after_epoch()
    steady = (samples - first_samples) / (elapsed - first) if elapsed > first else 0.0
    record = {"loader": name, "samples": samples, "epoch_s": round(elapsed, 3),
              "samples_per_s": round(samples / elapsed, 1),
              "time_to_first_batch_s": round(first, 3),
              "steady_samples_per_s": round(steady, 1),
              "peak_pss_added_mib": round(max(0, peak - before) / 2**20, 1),
              "loader_cpu_s": round(cpu, 2)}
    if total_bytes:
        record["mb_per_s"] = round(total_bytes / elapsed / 1e6, 2)
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--per-file-limit", type=int, default=1000,
                        help="per-file loaders read a shuffled subset this large (their rate "
                        "does not depend on the dataset's size; all of it would take long)")
    parser.add_argument("--decode", action="store_true",
                        help="decode + crop each image (stoker's loaders, torch's per-file "
                        "one and the decode bound; the peers read bytes only)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--server-in-process", action="store_true",
                        help="run moto and the proxy on threads of this process (sharing its "
                        "GIL with the loop that receives batches) instead of a process of "
                        "their own")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stoker-remote-bench-"))
    try:
        create_us = [file_create_us(tmp)]
        results = measure(tmp, args)
        create_us.append(file_create_us(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results[0]["samples_per_s"]
    bounds = [r["samples_per_s"] for r in results if r["loader"].endswith("_bound")]
    ceiling = [r["samples_per_s"] for r in results if r["loader"] == "shared_cpu_ceiling"]
    for record in results:
        record |= {"workload": "remote_shards", "latency_ms": args.latency_ms,
                   "num_workers": args.workers, "decode": args.decode,
                   "speedup_vs_torch_per_file": round(record.get("samples_per_s", 0) / base, 2),
                   "machine": machine_info(), "file_create_us_before_after": create_us}
        if "error" in record:
            record["speedup_vs_torch_per_file"] = 0.0
        elif "steady_samples_per_s" in record:
            record["steady_fraction_of_bound"] = round(
                record["steady_samples_per_s"] / min(bounds), 3)
            if ceiling:
                record["steady_fraction_of_shared_cpu_ceiling"] = round(
                    record["steady_samples_per_s"] / ceiling[0], 3)
        print(json.dumps(record), flush=True)


def file_create_us(directory: Path, files: int = 200) -> float:
    """CPU microseconds to create (and close) an empty file where the caches go: a cold
    shard costs a cache two (its lock file and its download's file). On this machine it
    ranged 15-650 us from one minute to the next, and is part of why runs differ."""
    where = Path(tempfile.mkdtemp(prefix="create-", dir=directory))
    cpu = time.process_time()
    for i in range(files):
        os.close(os.open(where / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644))
    cpu = time.process_time() - cpu
    shutil.rmtree(where)
    return round(cpu / files * 1e6, 1)


def measure(tmp: Path, args: Any) -> list[dict[str, Any]]:
    names = write_folder(tmp / "files", args.samples)
    pack(str(tmp / "files"), str(tmp / "packed"), samples_per_shard=args.per_shard,
         workers=1, progress=False)
    transform = _decoded if args.decode else _jpg_len
    results: list[dict[str, Any]] = []
    with (S3Server() if args.server_in_process else S3ServerProcess()) as s3:
        s3.upload_dir(str(tmp / "files"), "bucket-files", "files")
        s3.upload_dir(str(tmp / "packed"), "bench", "packed")
        peers = [] if args.no_peers or args.decode else remote_peers.peer_loaders(
            s3, tmp, tmp / "files", names, args)
        s3.faults.latency_s = args.latency_ms / 1e3
        options = s3.storage_options
        subset = np.random.default_rng(0).permutation(len(names))[: args.per_file_limit]
        urls = [f"s3://bucket-files/files/{names[i]}" for i in sorted(subset)]
        common = {"batch_size": args.batch, "shuffle": True, "num_workers": args.workers}

        server_cpu = getattr(s3, "cpu_s", lambda: 0.0)
        server_pids = getattr(s3, "pids", ())

        def drop_caches() -> None:
            # Each epoch's cache goes with it, so that no loader starts on a disk holding
            # the gigabytes the loaders before it wrote (whose writeback may still run).
            for entry in tmp.iterdir():
                if "cache-" in entry.name:
                    shutil.rmtree(entry, ignore_errors=True)

        def measured(name: str, make: Callable[[], Iterable[Any]]) -> None:
            gets, cpu = s3.faults.gets, server_cpu()
            record = run(name, make, exclude=server_pids, after_epoch=drop_caches)
            results.append(record | {"gets": (s3.faults.gets - gets) // 2,  # per epoch
                                     "server_cpu_s": round((server_cpu() - cpu) / 2, 2)})

        measured("torch_per_file", lambda: TorchDataLoader(
            PerFile(urls, options, args.decode), generator=torch.Generator().manual_seed(0),
            **common))

        def cold_cache() -> str:  # every epoch starts with an empty one
            return tempfile.mkdtemp(prefix="cache-", dir=tmp)

        def stoker_shards(fetch: str, client: str = "fsspec") -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                disk = {"cache_dir": cold_cache(), "cache_bytes": 1 << 34} if fetch == "shard" \
                    else {}
                source = open_source("s3://bench/packed/index.json", storage_options=options,
                                     fetch=fetch, client=client, **disk)
                ds = TarShards("s3://bench/packed/index.json", source=source,
                               transform=transform)
                return stoker.DataLoader(ds, generator=torch.Generator().manual_seed(0),
                                         **common)
            return make

        measured("stoker_packed_shards", stoker_shards("shard"))
        if len(names) <= 5000:  # a GET per sample, as slow as per-file: minutes beyond
            measured("stoker_packed_ranges", stoker_shards("range"))
        shard_urls = [f"s3://bench/packed/{n}" for n in sorted(os.listdir(tmp / "packed"))
                      if n.endswith(".tar")]

        def stoker_stream(shards: str | list[str],
                          client: str = "fsspec") -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                source = open_source(shard_urls[0], storage_options=options, fetch="shard",
                                     cache_dir=cold_cache(), cache_bytes=1 << 34, client=client)
                stream = TarShardStream(shards, source=source, transform=transform,
                                        shuffle_buffer=1000)
                return stoker.DataLoader(stream, batch_size=args.batch, num_workers=args.workers)
            return make

        measured("stoker_stream", stoker_stream("s3://bench/packed/index.json"))
        measured("stoker_stream_unindexed", stoker_stream(shard_urls))
        if not args.decode and not args.no_peers:
            web = webdataset_http(s3.endpoint_url, [u.rsplit("/", 1)[1] for u in shard_urls],
                                  args)
            if web is not None:
                measured("webdataset_http", lambda: web)
            for name, make in peers:
                try:
                    measured(name, make)
                except Exception as exc:  # a peer failing is a result: record it, go on
                    results.append({"loader": name, "error": f"{type(exc).__name__}: {exc}"})
        # After the peers: once obstore's runtime started here, a peer's forked workers
        # that use obstore (litdata does) hang (NOTE [ The obstore client ]).
        if "obstore" in CLIENTS:
            measured("stoker_packed_shards_obstore", stoker_shards("shard", "obstore"))
            measured("stoker_stream_obstore", stoker_stream("s3://bench/packed/index.json",
                                                            "obstore"))
        network = network_bound(shard_urls, options, args.samples, server_cpu)
        results.append(network)
        if args.decode:
            decode = decode_bound(tmp / "files", names, args.workers)
            results += [decode, shared_cpu_bound(decode, network, args.samples)]
    return results


def shared_cpu_bound(decode: dict[str, Any], network: dict[str, Any],
                     samples: int) -> dict[str, Any]:
    """``--decode``: what this machine's cores allow when the server runs on them too: each
    sample costs its decode (one core's rate) plus the server's CPU for its bytes (from the
    network bound's run); no loader overhead at all. Not a goal's bound (those are the network
    and the decode bound): it says how much of the decode bound any loader could reach here."""
    cores = min(os.cpu_count() or 1, decode["samples_per_s"] / decode["per_core_samples_per_s"])
    per_sample = 1 / decode["per_core_samples_per_s"] + network["server_cpu_s"] / samples
    return {"loader": "shared_cpu_ceiling", "samples_per_s": round(cores / per_sample, 1),
            "of_decode_bound": round(cores / per_sample / decode["samples_per_s"], 3)}


if __name__ == "__main__":
    main()
