"""`stoker demo`'s tiers: the same JPEG files loaded in turn, each one change from the last.

1. torch's DataLoader over a torchvision pipeline, as most image training code has it:
   ``datasets.ImageFolder(root, transforms.Compose([RandomResizedCrop(224),
   RandomHorizontalFlip(), ToTensor(), Normalize(...)]))``: the baseline every ratio is taken
   against (torchvision's own classes where it can be imported, else ``stoker.vision`` with
   ``fuse=False``: torchvision's algorithms, call for call, decoded whole by Pillow);
2. stoker.DataLoader, the same dataset object (the drop-in: one import changed);
3. the same pipeline from ``stoker.vision`` (``from stoker.vision import datasets,
   transforms``: one more import changed; the Compose decodes only the crop it keeps);
4. a ``__getitem__`` written by hand on stoker's image path (``decode_crop_into``, uint8 out,
   normalised on the GPU);
5. with ``--packed``: the same files packed by ``stoker pack`` and read by ``TarShards`` with
   that line as its transform.

Each tier carries the line that changed, so the table shows what a user would write. The image
path's speed depends on the ``fastimage`` extra (simplejpeg, OpenCV); ``decoder_line`` says
which decoder it ran and how to install the fast one when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stoker.doctor.demo_workload import DecodeCropSample, ImagePathJpegDataset

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


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def torchvision_modules() -> tuple[Any, Any, str]:
    """(datasets, transforms, who) of the baseline: torchvision's, or, where it cannot be
    imported (its wheels need a matching torch build), stoker.vision run as written."""
    try:
        from torchvision import datasets, transforms
    except Exception:  # not installed, or built for another torch: it raises more than ImportError
        from stoker.vision import datasets, transforms

        return datasets, transforms, "stoker.vision, fuse=False (torchvision's steps)"
    return datasets, transforms, "torchvision"


def train_pipeline(datasets: Any, transforms: Any, root: str, fuse: bool | None) -> Any:
    """torchvision's ImageNet train recipe over the image folder ``root``; ``fuse`` for
    stoker.vision's ``Compose`` (None: torchvision's, which takes no such argument)."""
    steps = [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
             transforms.ToTensor(), transforms.Normalize(mean=MEAN, std=STD)]
    compose = transforms.Compose(steps) if fuse is None else transforms.Compose(steps, fuse=fuse)
    return datasets.ImageFolder(root, transform=compose)


def build_tiers(paths: Sequence[str], candidate: str, packed: str | None,
                folder: str) -> list[Tier]:
    """The tiers over ``paths`` (``folder``: the same files as an image folder, from
    ``link_folder``); ``packed``: a pack of them (tier 5), or None. A candidate other than
    stoker's (an A/A run against torch's own class) gets tiers 1 and 2 only."""
    tv_datasets, tv_transforms, who = torchvision_modules()
    fuse = None if who == "torchvision" else False
    dataset = train_pipeline(tv_datasets, tv_transforms, folder, fuse)
    drop_in = "stoker.DataLoader, same dataset" if candidate == STOKER else (
        f"{candidate}, same dataset")
    tiers = [
        Tier("torch", "torch DataLoader, torchvision code", TORCH, dataset),
        Tier("stoker" if candidate == STOKER else "candidate", drop_in, candidate, dataset,
             "from torch.utils.data import DataLoader",
             "from stoker import DataLoader" if candidate == STOKER
             else f"from {candidate.replace(':', ' import ')}"),
    ]
    if candidate != STOKER:
        return tiers
    from stoker.vision import datasets, transforms

    tiers.append(Tier(
        "stoker.vision", "+ stoker.vision, same pipeline", STOKER,
        train_pipeline(datasets, transforms, folder, True),
        "from torchvision import datasets, transforms",
        "from stoker.vision import datasets, transforms",
    ))
    tiers.append(Tier(
        "image path", "+ __getitem__ on the image path", STOKER, ImagePathJpegDataset(paths),
        "img = transform(Image.open(path).convert('RGB'))  # RandomResizedCrop, flip, ...",
        "img = decode_crop_into(data, out, sample_rng())  # uint8; normalise on the GPU",
    ))
    if packed is not None:
        from stoker.formats import TarShards

        tiers.append(Tier(
            "packed", "+ stoker pack, TarShards", STOKER,
            TarShards(packed, transform=DecodeCropSample()),
            "dataset = JpegDataset(paths)",
            "dataset = TarShards('shards/', transform=decode)  # after `stoker pack`; "
            "decode(sample): tier 4's decode_crop_into on sample['jpg']",
        ))
    return tiers


def link_folder(paths: Sequence[str], root: str) -> str:
    """``root``/folder/class<k>/: links to ``paths`` in 10 classes (as the dataset's labels),
    the layout ``ImageFolder`` and ``stoker pack`` read; made once."""
    folder = os.path.join(root, "folder")
    for i, path in enumerate(paths):
        klass = os.path.join(folder, f"class{i % 10}")
        os.makedirs(klass, exist_ok=True)
        link = os.path.join(klass, os.path.basename(path))
        if not os.path.lexists(link):
            os.symlink(path, link)
    return folder


def pack_files(paths: Sequence[str], root: str) -> str:
    """``stoker pack`` of ``paths`` (their image folder, ``link_folder``) into ``root``/shards;
    returns the shards' directory."""
    from stoker.formats import pack

    folder = link_folder(paths, root)
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
