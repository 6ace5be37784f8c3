"""Time to the first batch in a fresh process: what a training job's first epoch pays, where
``remote_shards.py`` measures loaders one after another in one process (so imports, botocore's
parsed S3 models and the process's first fork are paid once, before its timers).

Each loader runs in a new Python process that imports ``torch`` and the loader's own package
(``stoker``, or ``webdataset``), then times from opening the dataset to its first batch, the
same things counted for every loader: the S3 client library's import (stoker's s3fs or
obstore, imported lazily; the ``boto3`` that presigns webdataset's URLs), the S3 client, the
manifest (stoker) or the presigned URLs (webdataset, reported also apart as ``setup_s``: its
part of the first batch), the workers' start and the downloads. Same server as
``remote_shards.py`` (moto + 10 ms per request, ``--bandwidth-mbps`` a cap, in a process of its
own), same data and pack (``--image-size``, ``--shard-mb``, ``--data-dir`` as there), cold
cache, 2 workers, batch 32, shuffled, raw bytes.

    .venv/bin/python benchmarks/remote_first_batch.py [--samples 20000] [--runs 3]
    .venv/bin/python benchmarks/remote_first_batch.py --samples 20000 --image-size 500x375 \
        --shard-mb 64 --bandwidth-mbps 100 [--data-dir /tmp/stoker-bench-data]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KINDS = ("stoker_packed_shards", "stoker_stream", "stoker_stream_unindexed", "webdataset_http")


def child(kind: str, endpoint: str, shard_names: list[str], cache: str,
          main_downloads: bool = True, client: str = "auto") -> list[float]:
    """In a fresh process: seconds from opening the dataset to its first batch, then to shut
    its iterator down, then (WebDataset) what its setup took before its timer started."""
    import torch  # noqa: F401  (what every training script has imported)

    def length(sample: dict[str, Any]) -> int:
        return len(sample["jpg"])

    if kind == "webdataset_http":
        import webdataset as wds
        from torch.utils.data import DataLoader

        # In its timer, as stoker's timer counts s3fs's import and client: boto3's import and
        # client, which presign the URLs; reported also apart as setup_s.
        start = time.perf_counter()
        import boto3

        presigner = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        urls = [presigner.generate_presigned_url("get_object", ExpiresIn=3600, Params={
            "Bucket": "bench", "Key": f"packed/{n}"}) for n in shard_names]
        setup = time.perf_counter() - start
        dataset = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None,
                                  empty_check=False).shuffle(1000).map(length))
        return _first_batch_s(DataLoader(dataset, batch_size=32, num_workers=2),
                              start) + [setup]
    import stoker
    from stoker.formats import TarShards, TarShardStream
    from stoker.storage import open_source

    options = {"client_kwargs": {"endpoint_url": endpoint}}
    manifest = "s3://bench/packed/index.json"
    start = time.perf_counter()
    source = open_source(manifest, storage_options=options, fetch="shard", cache_dir=cache,
                         cache_bytes=1 << 34, main_downloads=main_downloads, client=client)
    if kind == "stoker_packed_shards":
        loader: Any = stoker.DataLoader(TarShards(manifest, source=source, transform=length),
                                        batch_size=32, num_workers=2, shuffle=True)
    else:
        shards = manifest if kind == "stoker_stream" else [
            f"s3://bench/packed/{n}" for n in shard_names]
        loader = stoker.DataLoader(TarShardStream(shards, source=source, transform=length),
                                   batch_size=32, num_workers=2)
    return _first_batch_s(loader, start)


def _first_batch_s(loader: Any, start: float) -> list[float]:
    """Seconds to the first batch, then seconds to shut the iterator down (kept apart: a
    ``next(iter(loader))`` would time the shutdown too, as the iterator is freed)."""
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    began = time.perf_counter()
    del it
    return [first, time.perf_counter() - began]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # before any import a loader's process would not have
        kind, endpoint, shard_names, cache, main, client = sys.argv[2:8]
        print(json.dumps(child(kind, endpoint, json.loads(shard_names), cache, main == "1",
                               client)), flush=True)
        return
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tests" / "integration"))
    from remote_shards import add_data_args

    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20000)
    add_data_args(parser)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loaders", default=",".join(KINDS), help="comma-separated, of " +
                        ", ".join(KINDS))
    parser.add_argument("--no-main-downloads", action="store_true",
                        help="stoker's workers download their own shards (main_downloads=False)")
    parser.add_argument("--client", default="auto", choices=("auto", "fsspec", "obstore"),
                        help="stoker's S3 client (open_source(client=...))")
    args = parser.parse_args()
    from _harness import machine_info
    from _s3_server import S3ServerProcess
    from remote_shards import prepare

    tmp = Path(tempfile.mkdtemp(prefix="stoker-first-batch-"))
    try:
        _, _, packed = prepare(args, tmp)
        names = sorted(n for n in os.listdir(packed) if n.endswith(".tar"))
        with S3ServerProcess() as s3:
            s3.upload_dir(str(packed), "bench", "packed")
            s3.faults.latency_s = args.latency_ms / 1e3
            s3.faults.bandwidth_bps = args.bandwidth_mbps * 1e6
            env = dict(os.environ, AWS_ACCESS_KEY_ID="testing",
                       AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
            kinds = [k for k in args.loaders.split(",") if k]
            unknown = sorted(set(kinds) - set(KINDS))
            if unknown:
                raise SystemExit(f"--loaders: unknown {unknown}; expected some of {KINDS}")
            times: dict[str, list[float]] = {k: [] for k in kinds}
            shutdowns: dict[str, list[float]] = {k: [] for k in kinds}
            setups: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.runs):  # interleaved: drift hits every loader alike
                for kind in kinds:
                    cache = tempfile.mkdtemp(prefix="cache-", dir=tmp)
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", kind, s3.endpoint_url,
                         json.dumps(names), cache, "0" if args.no_main_downloads else "1",
                         args.client],
                        env=env, capture_output=True, text=True, timeout=300)
                    if done.returncode != 0 or not done.stdout.strip():
                        if "No module named" in done.stderr:
                            break  # webdataset not installed here
                        raise RuntimeError(f"{kind}: {done.stderr[-2000:]}")
                    first, shutdown, *setup = json.loads(done.stdout.strip().splitlines()[-1])
                    times[kind].append(first)
                    shutdowns[kind].append(shutdown)
                    setups[kind].extend(setup)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for kind, seconds in times.items():
        if seconds:
            print(json.dumps({
                "workload": "remote_first_batch", "loader": kind, "samples": args.samples,
                "shards": len(names), "latency_ms": args.latency_ms,
                "bandwidth_mbps": args.bandwidth_mbps or None,
                "image_size": "x".join(map(str, args.image_size or (256, 192))),
                "shard_mb": args.shard_mb, "per_shard": None if args.shard_mb else args.per_shard,
                "fresh_process_first_batch_s": round(statistics.median(seconds), 3),
                "main_downloads": not args.no_main_downloads, "client": args.client,
                "runs_s": [round(s, 3) for s in seconds],
                "shutdown_s": [round(s, 3) for s in shutdowns[kind]],
                **({"setup_s": [round(s, 3) for s in setups[kind]]} if setups[kind] else {}),
                "machine": machine_info()}))


if __name__ == "__main__":
    main()
