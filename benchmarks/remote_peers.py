"""The streaming peers of ``remote_shards.py``: Lightning's ``litdata`` (``optimize`` +
``StreamingDataset``/``StreamingDataLoader``) and MosaicML's ``streaming`` (``MDSWriter`` +
``StreamingDataset`` in torch's DataLoader), reading the same JPEGs from the same S3 server
through the same proxy.

Each peer packs the image folder in its own format (not timed), with shards like stoker's:
``args.per_shard`` samples per shard, or with ``args.shard_mb`` set, shards of that many MiB cut
by the peer's own byte limit (litdata's ``chunk_bytes``, mosaic's ``size_limit``; stoker's
``pack(shard_size_mb=...)``), uploads it to ``s3://bench/<peer>/`` and is read with shuffling
on, ``args.batch`` and ``args.workers``, a cold cache directory of its own per epoch, each
sample passed through the benchmark's transform (by default the JPEG's byte length; with
``--decode pil`` a PIL decode and crop). A peer whose library is not installed is left out.

The peers are the ``peers`` extra, not the test one: mosaicml-streaming pins numpy<2.2 and
pulls torchvision, so they get a venv of their own. litdata's ``optimize`` spawns a process, so
the calling script's main module must be guarded by ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader as TorchDataLoader

Factory = Callable[[], Iterable]
Transform = Callable[[dict[str, Any]], Any] | None
_caches = itertools.count()
_torchvision_ops: Any = None  # see _import_streaming


def peer_loaders(s3: Any, tmp: Path, folder: Path, names: list[str], args: Any,
                 transform: Transform = None, wanted: Callable[[str], bool] = lambda _: True
                 ) -> list[tuple[str, Factory, int]]:
    """``(name, make_loader, shards)`` per installed peer that ``wanted(name)``, its shards
    (``shards`` of them) already in the bucket "bench" (which must exist); ``make_loader()``
    builds the peer's loader over a new, empty cache. mosaicml-streaming comes twice: as
    shipped, and with its workers' own S3 clients (``mosaic_streaming_own_clients``, see
    ``_mosaic``).

    ``folder / names[i]`` is an image ``cK/NNNNNN.jpg`` of label K; ``args`` has ``per_shard``,
    ``shard_mb`` (None: by ``per_shard``), ``batch`` and ``workers``; ``transform`` takes a
    sample ``{"jpg": bytes, ...}`` (default: its JPEG's length)."""
    transform = transform or _jpg_len
    samples = [(str(folder / n), int(n.split("/", 1)[0][1:])) for n in sorted(names)]
    loaders: list[tuple[str, Factory, int]] = []
    if wanted("litdata"):
        litdata = _litdata(s3, tmp, samples, args, transform)
        if litdata is not None:
            loaders.append(("litdata", *litdata))
    mosaic_names = ("mosaic_streaming", "mosaic_streaming_own_clients")
    if any(map(wanted, mosaic_names)):
        mosaic = _mosaic(s3, tmp, samples, args, transform)
        if mosaic is not None:
            make, shards = mosaic
            loaders += [(name, partial(make, own), shards) for name, own
                        in zip(mosaic_names, (False, True), strict=True) if wanted(name)]
    return loaders


def _shard_bytes(args: Any) -> int | None:
    """``args.shard_mb`` in bytes (MiB, as stoker's ``shard_size_mb``), or None."""
    shard_mb = getattr(args, "shard_mb", None)
    return int(shard_mb * 2**20) if shard_mb else None


def _cold_cache(tmp: Path, name: str) -> str:
    path = tmp / f"{name}-cache-{next(_caches)}"
    path.mkdir(parents=True)
    return str(path)


def _jpg_len(sample: dict[str, Any]) -> int:
    return len(sample["jpg"])


def _read_sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label}  # bytes, not an image: no decode


# -- litdata ------------------------------------------------------------------------------------


def _litdata(s3: Any, tmp: Path, samples: list[tuple[str, int]], args: Any,
             transform: Callable[[dict[str, Any]], Any]) -> tuple[Factory, int] | None:
    try:
        from litdata import StreamingDataLoader, StreamingDataset, optimize
    except ImportError:
        return None
    out = tmp / "litdata"
    # chunk_size counts samples, chunk_bytes bytes; reorder_files=False keeps the folder's
    # order (as stoker packs). optimize sets the process's start method to spawn (force=True);
    # every DataLoader built after it would spawn its workers, the other loaders included.
    method = multiprocessing.get_start_method()
    shard_bytes = _shard_bytes(args)
    size = {"chunk_bytes": shard_bytes} if shard_bytes else {"chunk_size": args.per_shard}
    try:
        optimize(fn=_read_sample, inputs=samples, output_dir=str(out), num_workers=1,
                 reorder_files=False, mode="overwrite", verbose=False, **size)
    finally:
        multiprocessing.set_start_method(method, force=True)
    s3.upload_dir(str(out), "bench", "litdata")
    # litdata's documented way to an S3-compatible server: boto3 client arguments.
    options = {"endpoint_url": s3.endpoint_url, "region_name": "us-east-1"}
    _allow_http_for_litdata(s3.endpoint_url)

    def make() -> Iterable:
        dataset = StreamingDataset("s3://bench/litdata/", cache_dir=_cold_cache(tmp, "litdata"),
                                   shuffle=True, storage_options=options, transform=transform)
        return StreamingDataLoader(dataset, batch_size=args.batch, num_workers=args.workers)

    return make, len(list(out.glob("*.bin")))


def _allow_http_for_litdata(endpoint: str) -> None:
    """litdata fetches chunks with obstore, built from its boto3 client's endpoint but with
    client options of its own that leave out ``allow_http``, and explicit options override
    obstore's AWS_ALLOW_HTTP: every chunk GET to an http endpoint fails ("HTTP error: builder
    error", obstore issue #159). Against real (https) S3 this changes nothing."""
    from litdata.streaming import downloader

    if endpoint.startswith("http://"):
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[typeddict-unknown-key]


# -- mosaicml-streaming -------------------------------------------------------------------------


def _import_streaming() -> Any:
    """``streaming``, or None. Its package imports torchvision; PyPI's torchvision wheels are
    CUDA builds whose ops do not load against a CPU torch, and torchvision 0.28 then fails at
    import (``operator torchvision::nms does not exist``, pytorch/vision#9086 unmerged). No
    torchvision op is used here, so their two schemas are declared for the import to pass."""
    try:
        import streaming
        return streaming
    except ImportError:
        return None
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
    import torch

    for module in [m for m in sys.modules if m.split(".")[0] in ("torchvision", "streaming")]:
        del sys.modules[module]  # the half-imported packages
    global _torchvision_ops
    _torchvision_ops = torch.library.Library("torchvision", "FRAGMENT")  # kept alive
    for op in ("nms", "qnms"):
        _torchvision_ops.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import streaming
    return streaming


def _mosaic(s3: Any, tmp: Path, samples: list[tuple[str, int]], args: Any,
            transform: Callable[[dict[str, Any]], Any]
            ) -> tuple[Callable[[bool], Iterable], int] | None:
    """Mosaic's parent process reads index.json with a boto3 client that its forked workers
    inherit, open keep-alive connection included; two workers sending on one socket cost a
    failed GET and a retry after botocore's backoff (~0.5-1.5 s to the first batch, one more
    GET), and at times a shard that fails to read ("Relative sample index 0 is not present").
    ``make(worker_clients=True)`` drops the parent's client before the fork, so each worker
    opens its own: what mosaic would need to do itself."""
    streaming = _import_streaming()
    if streaming is None:
        return None
    out = tmp / "mosaic_streaming"
    # MDSWriter cuts shards by bytes only (size_limit): with shard_mb, its own way; otherwise
    # a shard is flushed by hand every per_shard samples, as write() does at the limit.
    shard_bytes = _shard_bytes(args)
    with streaming.MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"},
                             size_limit=shard_bytes) as writer:
        for i, item in enumerate(samples):
            if not shard_bytes and i and i % args.per_shard == 0:
                writer.flush_shard()
                writer._reset_cache()
            writer.write(_read_sample(item))
    s3.upload_dir(str(out), "bench", "mosaic_streaming")
    os.environ["S3_ENDPOINT_URL"] = s3.endpoint_url  # mosaic's documented endpoint override

    class Transformed(streaming.StreamingDataset):  # type: ignore[name-defined]
        def __getitem__(self, index: int) -> Any:  # the subclassing mosaic's docs show
            return transform(super().__getitem__(index))

    def make(worker_clients: bool) -> Iterable:
        # A dataset's shared memory outlives it in this process; the next one (a new epoch
        # with a new cache) would see the last one's shard states without this mosaic call.
        streaming.base.util.clean_stale_shared_memory()
        # batch_size lets mosaic partition samples per batch across workers, as it recommends.
        dataset = Transformed(remote="s3://bench/mosaic_streaming/",
                          local=_cold_cache(tmp, "mosaic_streaming"), shuffle=True,
                          batch_size=args.batch)
        if worker_clients:
            for stream in dataset.streams:
                stream._downloader.clean_up()  # what mosaic calls to reset a failed client
        return TorchDataLoader(dataset, batch_size=args.batch, num_workers=args.workers)

    return make, len(list(out.glob("shard.*.mds")))
