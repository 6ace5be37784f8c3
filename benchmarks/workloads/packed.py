"""`packed`: the same JPEGs read as one file per sample through torch's DataLoader, and as
packed tar shards (`stoker pack`) through stoker's, same num_workers, same run; and the same
shards through `webdataset` (in torch's DataLoader), when it is installed.

Variants: `bytes` (the sample is its file's bytes: what storage and the loader cost),
`decode` (PIL decode + random-resized-crop 224 + flip: the CPU-bound pipeline of `jpeg`), and
`decode max-side 320`: the same, where stoker reads shards packed with `--max-side 320`
(FFCV's trick: a smaller JPEG decodes faster; the crops are then taken from the smaller image,
which is what that option trades); torch still reads the original files.
Loaders per variant: `torch` (per-file reads), `stoker` (shards, map-style: true shuffle),
and two controls in the extra fields' records: `stoker per-file` (stoker's loader, per-file
reads: separates the loader's share from the format's) and `webdataset` (its default
pipeline: shard shuffle + a 1,000-sample shuffle buffer, `split_by_worker`). The files and
shards sit in the page cache (warm): what is measured is the cost of reading them, not a disk.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from _harness import Context, Plan, measure

from stoker.cli.demo import decode_and_augment, make_jpeg_files
from stoker.formats import TarShards, pack


class FileBytes(torch.utils.data.Dataset[Any]):
    """One file per sample, opened and read in `__getitem__` (torchvision's ImageFolder way)."""

    def __init__(self, paths: list[str], decode: bool) -> None:
        self.paths, self.decode = paths, decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return _sample(data, i, self.decode)


def _sample(data: bytes, label: int, decode: bool) -> Any:
    if decode:
        return decode_and_augment(io.BytesIO(data)), label  # type: ignore[arg-type]
    return len(data), label


class ShardSample:
    """TarShards' transform: the same sample from the shard's bytes (a class: it pickles)."""

    def __init__(self, decode: bool) -> None:
        self.decode = decode

    def __call__(self, s: dict[str, Any]) -> Any:
        return _sample(s["jpg"], int(s["cls"]), self.decode)


def _webdataset(urls: list[str], decode: bool, shuffle_buffer: int) -> Any:
    try:
        import webdataset as wds
    except ImportError:
        return None
    transform = ShardSample(decode)
    return (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None, empty_check=False)
        .shuffle(shuffle_buffer)
        .map(transform)
    )


def _pack_kept(folder: Path, out: Path, **options: Any) -> None:
    """A finished pack is kept: the call returns at once the second time; one an older stoker
    packed under other rules (its plan differs) is packed again."""
    try:
        pack(str(folder), str(out), workers=2, progress=False, **options)
    except FileExistsError:
        shutil.rmtree(out)
        pack(str(folder), str(out), workers=2, progress=False, **options)


def _pack(images: int, cache: Path, small_too: bool) -> tuple[list[str], str, str]:
    paths = make_jpeg_files(cache / "files", images)
    folder = cache / "folder" / "all"
    if not folder.exists():  # an image folder of one class over the same files (links)
        folder.mkdir(parents=True)
        for i, p in enumerate(paths):
            (folder / f"{i:06d}.jpg").symlink_to(p)
    shards = cache / "shards"
    per_shard = max(8, images // 20)
    _pack_kept(cache / "folder", shards, samples_per_shard=per_shard)
    small = cache / "shards-max-side-320"
    if small_too:
        _pack_kept(cache / "folder", small, samples_per_shard=per_shard, max_side=320)
    return [str(folder / f"{i:06d}.jpg") for i in range(images)], str(shards), str(small)


def run(ctx: Context) -> list[dict[str, Any]]:
    images = 64 if ctx.quick else 2000
    cache = Path(tempfile.gettempdir()) / f"stoker-bench-packed-n{images}"
    paths, full, small = _pack(images, cache, small_too=not ctx.quick)
    batch = 16 if ctx.quick else 64
    plan = Plan(epochs=1, warmup_batches=1) if ctx.quick else Plan(epochs=3, warmup_batches=4)
    records: list[dict[str, Any]] = []
    # --quick (the smoke run): one variant, no controls; it checks the workload runs.
    variants = ("bytes",) if ctx.quick else ("bytes", "decode", "decode max-side 320")
    for variant in variants:
        decode = variant != "bytes"
        shards = small if variant.endswith("320") else full
        kwargs = {"batch_size": batch, "shuffle": True, "num_workers": 2}
        tar = TarShards(shards, transform=ShardSample(decode))
        files = FileBytes(paths, decode)
        runs = [("torch", "torch", files), ("stoker", "stoker", tar),
                ("stoker per-file", "stoker", files)]
        if ctx.candidate != "stoker" or ctx.quick:  # A/A run or smoke run: the pair only
            runs = [("torch", "torch", files), (ctx.candidate, ctx.candidate, tar)]
        for label, loader, dataset in runs:
            record = measure(ctx, loader, dataset, kwargs, plan)
            records.append({"workload": "packed", "variant": variant, **record, "loader": label,
                            "reads": "per-file" if dataset is files else "tar shards"})
        web = None if ctx.quick else _webdataset([s.path for s in tar.shards], decode, 1000)
        if web is not None:
            web_kwargs = {"batch_size": batch, "num_workers": 2}
            record = measure(ctx, "torch", web, web_kwargs, plan)
            records.append({"workload": "packed", "variant": variant, **record,
                            "loader": "webdataset", "reads": "tar shards"})
    for record in records:
        record.update(images=images, machine=ctx.machine)
    records.sort(key=lambda r: r["loader"] != "torch")
    return records
