"""Reading a dataset from an S3-compatible server with 10 ms added per request (and, with
``--bandwidth-mbps``, a bandwidth cap): packed tar shards through stoker against one object per
sample through torch's DataLoader, same ``num_workers``, same shuffled order of samples, cold
local cache, and against the streaming peers on the same samples.

The server is moto in server mode behind the tests' fault-injecting proxy
(``tests/integration/_s3_server.py``), which adds the latency and the cap (one token bucket
shared by all connections, bodies streamed in 64 KiB chunks), in a process of its own;
everything runs on this machine, so the network is loopback and the server shares the CPUs
with the loaders: each record says the CPU seconds the loader's processes (``loader_cpu_s``)
and the server (``server_cpu_s``) used. The server's Python is one GIL: about one core.

    .venv/bin/python benchmarks/remote_shards.py [--samples 3000] [--workers 2] [--decode]

At scale (issue 34's measurement), with the peers' venv (they are the ``peers`` extra; see
``remote_peers.py`` and benchmarks/README.md for making it):

    python benchmarks/remote_shards.py --samples 20000 --image-size 500x375 --shard-mb 64 \
        --bandwidth-mbps 100 [--decode pil] [--data-dir /tmp/stoker-bench-data]

Data: by default ~6 KB synthetic JPEGs (256x192, upscaled noise), ``--per-shard`` samples per
shard. ``--image-size WxH`` makes photo-like q90 JPEGs instead (at 500x375 ~62 KB, 38-80 KB;
~50 s for 20,000 on 2 cores, a process per core); ``--shard-mb`` packs shards of that many MiB
(``pack(shard_size_mb=...)``; the peers cut theirs at the same byte size); ``--data-dir``
keeps the images and the pack between runs (keyed by the arguments). Only the
``--per-file-limit`` objects the per-file loader reads are uploaded one per sample.

Transforms, the same for every loader: the raw JPEG bytes' length (default; isolates the
storage path); ``--decode pil``: PIL ``Image.open(...).convert("RGB")``, a RandomResizedCrop
box (scale 0.08-1, ratio 3/4-4/3), crop and bilinear resize to 224x224, a random flip, a uint8
CHW tensor (what a torchvision-style pipeline does), for every loader, the peers included, and
one more loader, ``stoker_stream_fast_decode``: the stream through stoker's fast image path;
``--decode fast`` (or bare ``--decode``): stoker's fast image path
(``stoker.image.decode_crop_into``, same crop) for stoker's loaders and torch's, no peers.

Every loader's epoch starts cold (clients, manifest, indexes, an empty cache). Each loader
runs two epochs: one timed, one sampling memory (reading PSS costs CPU). The first batch is
counted the same way for every loader: from the call that builds the loader (S3 client,
manifest and index GETs, webdataset's boto3 client and presigned URLs, the peers' index
downloads, the workers' start) to the first batch in hand; modules imported earlier in this
process are not counted (``remote_first_batch.py`` counts them, in a fresh process).

One JSON record per loader: ``samples_per_s`` over the epoch and after its first batch
(``steady_samples_per_s``), ``time_to_first_batch_s``, GETs, shards, the CPU of its processes
(``loader_cpu_s``, ``loader_cpu_ms_per_sample``) and of the server, the peak PSS its processes
added, the ratio against torch's per-file loader (which reads a shuffled subset of
``--per-file-limit`` files: its rate does not depend on the dataset's size), and its fractions
of the bounds: ``fraction_of_network_bound`` (epoch samples/s over the measured bound),
``fraction_of_network_cap`` (with a cap), ``fraction_of_decode_bound`` (with a decode), and
``steady_fraction_of_bound`` (steady samples/s over the smaller of the network and decode
bounds).
Bounds: ``network_bound``, measured (every shard fetched whole by a connected client, at the
best of 2-16 GETs at a time); with a cap also ``network_cap``, the cap's own: cap bytes/s over
the mean bytes per sample in stoker's shards; with a decode ``decode_bound`` (the transform on
bytes in memory, one core's rate times ``--workers``; with ``pil`` also ``decode_bound_fast``)
and ``shared_cpu_ceiling``: the decode plus the server's CPU per sample on this machine's
cores (the server shares them), the most any loader could reach here.
Loaders: stoker's ``TarShards`` by whole shards (``stoker_packed_shards``) and by ranges (up to
5,000 samples), ``TarShardStream`` (whole shards in order, a 1,000-sample buffer) over the
pack's indexes (``stoker_stream``) and over the bare shard list, each shard's tar parsed
(``stoker_stream_unindexed``: plain WebDataset shards), all with the default client
(``client="auto"``: obstore where installed), the first two again with s3fs
(``client="fsspec"``, ``*_s3fs``), and the peers (run first: NOTE [ The obstore client ]):
``webdataset_http`` (presigned HTTP URLs to stoker's shards, its curl pipe, torch's
DataLoader) and those of ``remote_peers.py`` (litdata, mosaicml-streaming), each when
installed. ``--loaders`` runs some of them (the bounds always run).
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
from concurrent.futures import ProcessPoolExecutor
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
from stoker.formats import TarShards, TarShardStream  # noqa: E402
from stoker.storage import open_source  # noqa: E402

# The S3 clients the network bound tries: s3fs always, obstore when installed.
CLIENTS = ("fsspec",) + (("obstore",) if importlib.util.find_spec("obstore") else ())


DATA_VERSION = 1  # of write_folder's images: part of --data-dir's keys
Transform = Callable[[dict[str, Any]], Any]


def write_folder(root: Path, n: int, classes: int = 10,
                 image_size: tuple[int, int] | None = None) -> list[str]:
    """``n`` JPEGs ``c{i % classes}/{i:06d}.jpg`` under ``root``: by default tiny ones (~6 KB,
    upscaled noise), or ``image_size`` (width, height) photo-like ones (``photo_like_jpeg``),
    made by a process per core."""
    names = [f"c{i % classes}/{i:06d}.jpg" for i in range(n)]
    for c in range(min(n, classes)):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
    if image_size is not None:
        step = 250
        with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(_write_photos, [(str(root), names[k: k + step], k, image_size)
                                          for k in range(0, n, step)]))
        return names
    from PIL import Image

    rng = np.random.default_rng(0)
    for rel in names:
        img = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        (root / rel).write_bytes(buf.getvalue())
    return names


def photo_like_jpeg(seed: int, width: int, height: int) -> bytes:
    """A q90 JPEG that compresses like a photo (at 500x375: ~62 KB on average, 38-80 KB from
    the 5th to the 95th percentile; pure noise would be ~300 KB), made in YCbCr as JPEG stores
    it: a luminance of a smooth field and mid-frequency shapes, made small and upscaled, plus a
    fine texture of a strength drawn per image; a smooth, muted chroma. ~5 ms of a core at
    500x375."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    size, small = (width, height), (max(2, width // 16), max(2, height // 16))
    cubic, linear = Image.Resampling.BICUBIC, Image.Resampling.BILINEAR

    def noise(h: int, w: int) -> np.ndarray:
        return rng.integers(0, 256, (max(2, h), max(2, w)), dtype=np.uint8)

    field = np.asarray(Image.fromarray(noise(4, 5)).resize(small, cubic), np.int16)
    shapes = (noise(small[1], small[0]).astype(np.int16) - 128) * 3 // 4
    low = np.clip(field // 2 + 64 + shapes, 0, 255).astype(np.uint8)
    luma = np.asarray(Image.fromarray(low).resize(size, cubic), np.int16)
    texture = noise((height + 1) // 2, (width + 1) // 2).repeat(2, 0).repeat(2, 1)
    luma = luma + (texture[:height, :width].astype(np.int16) - 128) * int(rng.integers(2, 16)) // 64
    cb, cr = (Image.fromarray((noise(4, 5) // 3 + 85).astype(np.uint8)).resize(size, linear)
              for _ in range(2))
    img = Image.merge("YCbCr", (Image.fromarray(np.clip(luma, 0, 255).astype(np.uint8)), cb, cr))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _write_photos(task: tuple[str, list[str], int, tuple[int, int]]) -> None:
    root, names, first, (width, height) = task
    for i, rel in enumerate(names, first):
        Path(root, rel).write_bytes(photo_like_jpeg(i, width, height))


def image_size(text: str) -> tuple[int, int]:
    """``--image-size``: ``WxH``."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, as 500x375") from None
    if width < 16 or height < 16:
        raise argparse.ArgumentTypeError(f"{text!r}: expected at least 16x16")
    return width, height


def prepare(args: Any, tmp: Path) -> tuple[Path, list[str], Path]:
    """The image folder, its names and stoker's pack of it: made in ``tmp``, or with
    ``args.data_dir`` kept there under names made of the arguments (a ``.done`` file beside
    each says it is whole) and made only when missing."""
    from stoker.formats import pack

    where = Path(args.data_dir) if args.data_dir else tmp
    size = args.image_size
    images_key = f"images-{args.samples}-" + (
        "tiny" if size is None else f"{size[0]}x{size[1]}") + f"-v{DATA_VERSION}"
    shards_key = f"{args.shard_mb:g}mb" if args.shard_mb else f"{args.per_shard}per"
    folder, packed = where / images_key, where / f"packed-{images_key}-{shards_key}"

    def made(path: Path, make: Callable[[], None]) -> None:
        done = path.with_name(path.name + ".done")
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            make()
            done.touch()

    def write() -> None:
        write_folder(folder, args.samples, image_size=size)

    def pack_it() -> None:
        by_size = {"samples_per_shard": None, "shard_size_mb": args.shard_mb} \
            if args.shard_mb else {"samples_per_shard": args.per_shard}
        pack(str(folder), str(packed), workers=1, progress=False, **by_size)

    made(folder, write)
    made(packed, pack_it)
    return folder, [f"c{i % 10}/{i:06d}.jpg" for i in range(args.samples)], packed


def _jpg_len(sample: dict[str, Any]) -> int:
    return len(sample["jpg"])


_RNG = np.random.default_rng()


def _decoded(sample: dict[str, Any]) -> torch.Tensor:
    """``--decode fast``: what an image pipeline does with the bytes (RandomResizedCrop(224) +
    flip into a uint8 CHW tensor) through stoker's fast image path."""
    from stoker.image import decode_crop_into

    out = torch.empty((3, 224, 224), dtype=torch.uint8)
    decode_crop_into(sample["jpg"], out, _RNG)
    return out


def _pil_crop(sample: dict[str, Any]) -> torch.Tensor:
    """``--decode pil``: the same with Pillow alone, as a torchvision-style ``__getitem__``
    does it (``benchmarks/image_decode.py``'s ``pillow_plain``): decode to RGB, a
    RandomResizedCrop box, crop + bilinear resize to 224x224, a random flip, a CHW tensor."""
    from PIL import Image

    from stoker.image import random_resized_crop_box

    img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    top, left, h, w = random_resized_crop_box(_RNG, img.height, img.width)
    img = img.crop((left, top, left + w, top + h)).resize((224, 224), Image.Resampling.BILINEAR)
    if _RNG.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous()  # as PILToTensor


TRANSFORMS: dict[str, Transform] = {"bytes": _jpg_len, "fast": _decoded, "pil": _pil_crop}


class PerFile(Dataset):
    """One object per sample, one GET each (what a Dataset over a bucket of files does)."""

    def __init__(self, urls: list[str], options: dict[str, Any], transform: Transform) -> None:
        self.urls, self.transform = urls, transform
        self.source = open_source(urls[0], storage_options=options, fetch="range")

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> Any:
        return self.transform({"jpg": self.source.read(self.urls[i])})


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


def decode_bound(folder: Path, names: list[str], workers: int, transform: str,
                 name: str = "decode_bound") -> dict[str, Any]:
    """``--decode``: the transform alone over bytes in memory, one core, times ``workers``
    (perfect scaling: a ceiling no loader reaches on a machine that also runs the server)."""
    blobs = [(folder / n).read_bytes() for n in names[:500]]
    fn = TRANSFORMS[transform]
    fn({"jpg": blobs[0]})
    start = time.perf_counter()
    for blob in blobs:
        fn({"jpg": blob})
    per_core = len(blobs) / (time.perf_counter() - start)
    return {"loader": name, "transform": transform,
            "samples_per_s": round(per_core * workers, 1),
            "per_core_samples_per_s": round(per_core, 1)}


def network_cap(bandwidth_mbps: float, shard_bytes: int, samples: int) -> dict[str, Any]:
    """``--bandwidth-mbps``: the cap's own bound, its bytes/s over the mean bytes per sample in
    stoker's shards (tar headers included); the measured ``network_bound`` is what the
    fractions use."""
    per_sample = shard_bytes / samples
    return {"loader": "network_cap", "samples_per_s": round(bandwidth_mbps * 1e6 / per_sample, 1),
            "mb_per_s": bandwidth_mbps, "mean_sample_bytes": round(per_sample)}


def webdataset_http(endpoint: str, shard_names: list[str], args: Any,
                    transform: Transform) -> Callable[[], Iterable[Any]] | None:
    """The peer on the same shards: webdataset's pipeline (shard shuffle + 1,000-sample
    buffer) over HTTP GETs of presigned URLs (its curl pipe, through the same proxy), in
    torch's DataLoader with the same workers. ``make()`` creates the boto3 client and presigns
    (in the first batch's time, as stoker's loaders create their S3 client in theirs). None
    when webdataset is not installed."""
    try:
        import boto3
        import webdataset as wds
    except ImportError:
        return None

    def make() -> Iterable[Any]:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        urls = [client.generate_presigned_url("get_object", ExpiresIn=3600, Params={
            "Bucket": "bench", "Key": f"packed/{n}"}) for n in shard_names]
        dataset = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None,
                                  empty_check=False).shuffle(1000).map(transform))
        return TorchDataLoader(dataset, batch_size=args.batch, num_workers=args.workers)

    return make


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
              "loader_cpu_s": round(cpu, 2),
              "loader_cpu_ms_per_sample": round(cpu * 1e3 / max(samples, 1), 3)}
    if total_bytes:
        record["mb_per_s"] = round(total_bytes / elapsed / 1e6, 2)
    return record


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """The data and server arguments ``remote_first_batch.py`` shares."""
    parser.add_argument("--per-shard", type=int, default=100,
                        help="samples per shard (unless --shard-mb)")
    parser.add_argument("--shard-mb", type=float, default=None,
                        help="shards of this many MiB instead (pack's shard_size_mb; the peers "
                        "cut theirs at the same byte size)")
    parser.add_argument("--image-size", type=image_size, default=None, metavar="WxH",
                        help="photo-like JPEGs of this size (~65 KB at 500x375) instead of "
                        "~6 KB ones")
    parser.add_argument("--data-dir", default=None,
                        help="keep the images and the pack here between runs (keyed by the "
                        "arguments); default: a temporary directory, removed")
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=0.0,
                        help="cap the server's replies to this many MB/s (10^6 bytes), all "
                        "connections together; 0: no cap")


LOADERS = ("torch_per_file", "stoker_packed_shards", "stoker_packed_ranges", "stoker_stream",
           "stoker_stream_unindexed", "stoker_stream_fast_decode", "webdataset_http",
           "litdata", "mosaic_streaming", "mosaic_streaming_own_clients",
           "stoker_packed_shards_s3fs", "stoker_stream_s3fs")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    add_data_args(parser)
    parser.add_argument("--per-file-limit", type=int, default=1000,
                        help="per-file loaders read a shuffled subset this large (their rate "
                        "does not depend on the dataset's size; all of it would take long)")
    parser.add_argument("--decode", nargs="?", const="fast", default=None,
                        choices=("fast", "pil"),
                        help="decode + crop each image: 'fast' (the default of a bare "
                        "--decode): stoker's fast image path, for stoker's loaders and torch's "
                        "(no peers); 'pil': Pillow, for every loader, the peers included")
    parser.add_argument("--loaders", default=None,
                        help="comma-separated, some of " + ", ".join(LOADERS) + " (default: all)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--server-in-process", action="store_true",
                        help="run moto and the proxy on threads of this process (sharing its "
                        "GIL with the loop that receives batches) instead of a process of "
                        "their own")
    args = parser.parse_args()
    if args.loaders is not None:
        args.loaders = {name for name in args.loaders.split(",") if name}
        if args.loaders - set(LOADERS):
            parser.error(f"--loaders: unknown {sorted(args.loaders - set(LOADERS))}")
    tmp = Path(tempfile.mkdtemp(prefix="stoker-remote-bench-"))
    try:
        create_us = [file_create_us(tmp)]
        results = measure(tmp, args)
        create_us.append(file_create_us(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    loaders = [r for r in results if "steady_samples_per_s" in r]
    base = next((r["samples_per_s"] for r in loaders if r["loader"] == "torch_per_file"), None)
    bound = {r["loader"]: r for r in results if "steady_samples_per_s" not in r}
    network = bound["network_bound"]["samples_per_s"]
    decode = {r["transform"]: r["samples_per_s"] for r in bound.values()
              if r["loader"].startswith("decode_bound")}
    ceiling = bound.get("shared_cpu_ceiling", {}).get("samples_per_s")
    for record in results:
        record |= {"workload": "remote_shards", "latency_ms": args.latency_ms,
                   "bandwidth_mbps": args.bandwidth_mbps or None, "num_workers": args.workers,
                   "decode": args.decode,
                   "image_size": "x".join(map(str, args.image_size or (256, 192))),
                   "shard_mb": args.shard_mb, "per_shard": None if args.shard_mb
                   else args.per_shard, "machine": machine_info(),
                   "file_create_us_before_after": create_us}
        if base:
            record["speedup_vs_torch_per_file"] = round(record.get("samples_per_s", 0) / base, 2)
        if "error" in record or "steady_samples_per_s" not in record:
            print(json.dumps(record), flush=True)
            continue
        rate, transform = record["samples_per_s"], record["transform"]
        record["fraction_of_network_bound"] = round(rate / network, 3)
        if "network_cap" in bound:
            record["fraction_of_network_cap"] = round(
                rate / bound["network_cap"]["samples_per_s"], 3)
        if transform in decode:
            record["fraction_of_decode_bound"] = round(rate / decode[transform], 3)
        record["steady_fraction_of_bound"] = round(record["steady_samples_per_s"] / min(
            [network] + ([decode[transform]] if transform in decode else [])), 3)
        if ceiling and transform == args.decode:
            record["steady_fraction_of_shared_cpu_ceiling"] = round(
                record["steady_samples_per_s"] / ceiling, 3)
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
    folder, names, packed = prepare(args, tmp)
    transform = args.decode or "bytes"
    shard_files = sorted(n for n in os.listdir(packed) if n.endswith(".tar"))
    shard_bytes = sum((packed / n).stat().st_size for n in shard_files)
    subset = np.random.default_rng(0).permutation(len(names))[: args.per_file_limit]
    per_file = [names[i] for i in sorted(subset)]
    for rel in per_file:  # only what the per-file loader reads goes up one object per sample
        (tmp / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / rel, tmp / "files" / rel)

    def wanted(name: str) -> bool:
        return args.loaders is None or name in args.loaders

    results: list[dict[str, Any]] = []
    with (S3Server() if args.server_in_process else S3ServerProcess()) as s3:
        s3.upload_dir(str(tmp / "files"), "bucket-files", "files")
        s3.upload_dir(str(packed), "bench", "packed")
        peers = [] if args.no_peers or args.decode == "fast" else remote_peers.peer_loaders(
            s3, tmp, folder, names, args, TRANSFORMS[transform], wanted)
        s3.faults.latency_s = args.latency_ms / 1e3
        s3.faults.bandwidth_bps = args.bandwidth_mbps * 1e6
        options = s3.storage_options
        urls = [f"s3://bucket-files/files/{rel}" for rel in per_file]
        common = {"batch_size": args.batch, "shuffle": True, "num_workers": args.workers}

        server_cpu = getattr(s3, "cpu_s", lambda: 0.0)
        server_pids = getattr(s3, "pids", ())

        def drop_caches() -> None:
            # Each epoch's cache goes with it, so that no loader starts on a disk holding
            # the gigabytes the loaders before it wrote (whose writeback may still run).
            for entry in tmp.iterdir():
                if "cache-" in entry.name:
                    shutil.rmtree(entry, ignore_errors=True)

        def measured(name: str, make: Callable[[], Iterable[Any]], shards: int,
                     how: str = transform) -> None:
            if not wanted(name):
                return
            gets, cpu = s3.faults.gets, server_cpu()
            record = run(name, make, exclude=server_pids, after_epoch=drop_caches)
            server = (server_cpu() - cpu) / 2  # per epoch
            results.append(record | {
                "transform": how, "shards": shards, "gets": (s3.faults.gets - gets) // 2,
                "server_cpu_s": round(server, 2),
                "server_cpu_ms_per_sample": round(server * 1e3 / max(record["samples"], 1), 3)})

        measured("torch_per_file", lambda: TorchDataLoader(
            PerFile(urls, options, TRANSFORMS[transform]),
            generator=torch.Generator().manual_seed(0), **common), 0)

        # The peers before stoker's loaders: once obstore's runtime started in this process
        # (stoker's default client), a peer's forked workers that use obstore (litdata does)
        # hang (NOTE [ The obstore client ]; stoker's own workers read with s3fs then).
        shards = len(shard_files)
        if args.decode != "fast" and not args.no_peers:
            web = webdataset_http(s3.endpoint_url, shard_files, args, TRANSFORMS[transform])
            if web is not None:
                measured("webdataset_http", web, shards)
            for name, make, peer_shards in peers:
                try:
                    measured(name, make, peer_shards)
                except Exception as exc:  # a peer failing is a result: record it, go on
                    results.append({"loader": name, "error": f"{type(exc).__name__}: {exc}"})

        def cold_cache() -> str:  # every epoch starts with an empty one
            return tempfile.mkdtemp(prefix="cache-", dir=tmp)

        def stoker_shards(fetch: str, client: str = "auto") -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                disk = {"cache_dir": cold_cache(), "cache_bytes": 1 << 34} if fetch == "shard" \
                    else {}
                source = open_source("s3://bench/packed/index.json", storage_options=options,
                                     fetch=fetch, client=client, **disk)
                ds = TarShards("s3://bench/packed/index.json", source=source,
                               transform=TRANSFORMS[transform])
                return stoker.DataLoader(ds, generator=torch.Generator().manual_seed(0),
                                         **common)
            return make

        measured("stoker_packed_shards", stoker_shards("shard"), shards)
        if len(names) <= 5000:  # a GET per sample, as slow as per-file: minutes beyond
            measured("stoker_packed_ranges", stoker_shards("range"), shards)
        shard_urls = [f"s3://bench/packed/{n}" for n in shard_files]

        def stoker_stream(shards: str | list[str], client: str = "auto",
                          how: str = transform) -> Callable[[], Iterable[Any]]:
            def make() -> Iterable[Any]:
                source = open_source(shard_urls[0], storage_options=options, fetch="shard",
                                     cache_dir=cold_cache(), cache_bytes=1 << 34, client=client)
                stream = TarShardStream(shards, source=source, transform=TRANSFORMS[how],
                                        shuffle_buffer=1000)
                return stoker.DataLoader(stream, batch_size=args.batch, num_workers=args.workers)
            return make

        measured("stoker_stream", stoker_stream("s3://bench/packed/index.json"), shards)
        measured("stoker_stream_unindexed", stoker_stream(shard_urls), shards)
        if args.decode == "pil":  # the fast image path's column, in the same run
            measured("stoker_stream_fast_decode", stoker_stream(
                "s3://bench/packed/index.json", how="fast"), shards, how="fast")
        # stoker's s3fs client (client="fsspec"; the default, "auto", is obstore here when
        # installed: NOTE [ The client by default ]).
        measured("stoker_packed_shards_s3fs", stoker_shards("shard", "fsspec"), shards)
        measured("stoker_stream_s3fs", stoker_stream("s3://bench/packed/index.json", "fsspec"),
                 shards)
        network = network_bound(shard_urls, options, args.samples, server_cpu)
        results.append(network | {"shards": shards, "shard_bytes": shard_bytes})
        if args.bandwidth_mbps:
            results.append(network_cap(args.bandwidth_mbps, shard_bytes, args.samples))
        if args.decode:
            decode = decode_bound(folder, names, args.workers, transform)
            results += [decode, shared_cpu_bound(decode, network, args.samples)]
            if args.decode == "pil":
                results.append(decode_bound(folder, names, args.workers, "fast",
                                            "decode_bound_fast"))
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
