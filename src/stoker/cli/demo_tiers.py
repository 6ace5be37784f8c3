"""`stoker demo`'s tiers: the same JPEG files loaded four ways, each one change from the last.

1. torch's DataLoader over the user's dataset (Pillow decode + RandomResizedCrop + flip in
   ``__getitem__``): the baseline every ratio is taken against;
2. stoker.DataLoader, the same dataset object (the drop-in: one import changed);
3. the same dataset class with its decode on stoker's image path (one line of ``__getitem__``
   changed to ``stoker.image.decode_crop_into``);
4. with ``--packed``: the same files packed by ``stoker pack`` and read by ``TarShards`` with
   that line as its transform.

Each tier carries the line that changed, so the table shows what a user would write. The image
path's speed depends on the ``fastimage`` extra (simplejpeg, OpenCV); ``decoder_line`` says
which decoder tier 3 ran and how to install the fast one when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stoker.doctor.demo_workload import DecodeCropSample, ImagePathJpegDataset, JpegDataset

STOKER = "stoker:DataLoader"
TORCH = "torch.utils.data:DataLoader"


@dataclass(frozen=True)
class Tier:
    """One way of loading the demo's files."""

    key: str  # short name in the run-by-run line
    title: str  # the table's row label
    loader: str  # "package.module:Class" of the loader
    dataset: Any
    was: str = ""  # the line before (empty: the baseline)
    now: str = ""  # the line after


def build_tiers(paths: Sequence[str], candidate: str, packed: str | None) -> list[Tier]:
    """The tiers over ``paths``; ``packed``: a pack of the same files (tier 4), or None.
    A candidate other than stoker's (an A/A run against torch's own class) gets tiers 1 and 2
    only: the image path draws from ``stoker.sample_rng()``, which needs a stoker loader."""
    dataset = JpegDataset(paths)
    drop_in = "stoker.DataLoader, same dataset" if candidate == STOKER else (
        f"{candidate}, same dataset")
    tiers = [
        Tier("torch", "torch DataLoader, your PIL code", TORCH, dataset),
        Tier("stoker" if candidate == STOKER else "candidate", drop_in, candidate, dataset,
             "from torch.utils.data import DataLoader",
             "from stoker import DataLoader" if candidate == STOKER
             else f"from {candidate.replace(':', ' import ')}"),
    ]
    if candidate != STOKER:
        return tiers
    tiers.append(Tier(
        "image path", "+ stoker's image path", STOKER, ImagePathJpegDataset(paths),
        "img = Image.open(path).convert('RGB'); ... RandomResizedCrop, flip, PILToTensor",
        "img = decode_crop_into(data, out, sample_rng())",
    ))
    if packed is not None:
        from stoker.formats import TarShards

        tiers.append(Tier(
            "packed", "+ stoker pack, TarShards", STOKER,
            TarShards(packed, transform=DecodeCropSample()),
            "dataset = JpegDataset(paths)",
            "dataset = TarShards('shards/', transform=decode_crop)  # after `stoker pack`",
        ))
    return tiers


def pack_files(paths: Sequence[str], root: str) -> str:
    """``stoker pack`` of ``paths`` (an image folder of links to them, 10 classes, as the
    dataset's labels) into ``root``/shards; returns the shards' directory."""
    from stoker.formats import pack

    folder = os.path.join(root, "folder")
    for i, path in enumerate(paths):
        klass = os.path.join(folder, f"class{i % 10}")
        os.makedirs(klass, exist_ok=True)
        os.symlink(path, os.path.join(klass, os.path.basename(path)))
    shards = os.path.join(root, "shards")
    pack(folder, shards, samples_per_shard=max(8, len(paths) // 16), workers=2, progress=False)
    return shards


def decoder_line() -> str:
    """Which decoder the image path ran (the ``fastimage`` extra, or Pillow's fallback)."""
    from stoker.image.decode import fast_parts

    fast, resize = fast_parts()
    if fast and resize:
        return "image path decoder: simplejpeg + OpenCV (the fastimage extra)"
    have = "simplejpeg, Pillow's resize" if fast else "OpenCV's resize, Pillow's decode" if (
        resize) else "Pillow (the fallback)"
    return (f"image path decoder: {have}; for the fast one install the fastimage extra "
            "(simplejpeg + OpenCV): pip install 'stoker[fastimage]'")


def ratio(rate: float, base: float) -> str:
    return f"{rate / base:.2f}x" if base > 0 else "n/a"


def run_by_run(tiers: Sequence[Tier], runs: Sequence[Sequence[Any]]) -> str:
    """Each tier's ratio to torch's in each round: "stoker 1.02x 1.05x; image path ..."."""
    return "; ".join(
        f"{tier.key} " + " ".join(ratio(c.samples_per_s, b.samples_per_s)
                                  for b, c in zip(runs[0], runs[k], strict=True))
        for k, tier in enumerate(tiers) if k > 0
    )


def format_tiers(tiers: Sequence[Tier], results: Sequence[Any]) -> str:
    """The table: one row per tier (samples/s, ratio to tier 1, first batch, peak memory),
    then each tier's changed line."""
    base = results[0].samples_per_s
    rows = [f"{'tier':<36}{'samples/s':>10}{'vs torch':>10}{'first batch':>13}{'peak PSS':>10}"]
    for n, (tier, r) in enumerate(zip(tiers, results, strict=True), 1):
        rows.append(f"{n} {tier.title:<34}{r.samples_per_s:>10.1f}"
                    f"{ratio(r.samples_per_s, base):>10}{r.time_to_first_batch_s:>11.3f} s"
                    f"{r.peak_pss_mib:>6.0f} MiB")
    rows += ["", "the line that changed (each tier from the one above):"]
    for n, tier in enumerate(tiers, 1):
        if tier.was:
            rows += [f"  {n}  {tier.was}", f"     -> {tier.now}"]
    return "\n".join(rows)


def verdict(tiers: Sequence[Tier], results: Sequence[Any]) -> str:
    """The headline: the best tier's ratio to torch's loader, and the drop-in's alone."""
    base = results[0].samples_per_s
    best = max(range(1, len(tiers)), key=lambda k: results[k].samples_per_s)
    line = (f"verdict: {ratio(results[best].samples_per_s, base)} torch's samples/s with tier "
            f"{best + 1} ({tiers[best].title.lstrip('+ ')})")
    if best != 1:
        line += f"; the drop-in alone (tier 2): {ratio(results[1].samples_per_s, base)}"
    return line
