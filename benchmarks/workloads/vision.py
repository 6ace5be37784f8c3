"""`vision`: the image pipeline most training code has, with only the import changed (issue 45).

torchvision's train recipe, `RandomResizedCrop(224)`, `RandomHorizontalFlip()`, `ToTensor()`,
`Normalize(mean, std)`, over the benchmark JPEGs (`jpeg`'s 2000 files, ~256x256..500x375),
batch 64, shuffle, num_workers=2, three ways of holding the files:

* `ImageFolder`: `root/<class>/<file>.jpg`, torchvision's `datasets.ImageFolder`;
* `TarShards`: stoker's own shards (4 plain tars), each sample's `jpg` bytes given to the
  `Compose`;
* `datasets Image column`: a Hugging Face `datasets.Dataset` with an `Image` column and
  `set_transform`. stoker's side casts the column with `Image(decode=False)`, the one line
  besides the import (datasets decodes an `Image()` value with Pillow before any transform).

torch's DataLoader runs the pipeline as torchvision writes it: Pillow decodes the whole file,
then each transform in turn: torchvision's own classes where torchvision imports (the GPU
machine), else `stoker.vision` with `fuse=False`, torchvision's algorithms call for call
(torchvision cannot be installed beside the CPU torch here; tests/unit/test_vision_torchvision.py
checks the two equal where it can; each record's `pipeline` says which ran). stoker's
DataLoader runs the same list from `stoker.vision`, where the `Compose` decodes fused with the
crop (NOTE [ Fused decode in Compose ]). The ratio is what changing the import buys.

Each variant is measured in two rounds, the order of the loaders alternating (`round 1`,
`round 2` in the variant): a core's speed drifts within seconds on a shared machine.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import Context, Plan, _finish, _loader_order, measure

from stoker.cli.demo import make_jpeg_files
from stoker.vision import datasets, transforms

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLASSES = 10


def _torchvision() -> tuple[Any, Any] | None:
    try:
        import torchvision
    except Exception:  # not installed, or built for another torch
        return None
    return torchvision.datasets, torchvision.transforms


TORCHVISION = _torchvision()
AS_WRITTEN = "torchvision" if TORCHVISION else "stoker.vision, fuse=False (torchvision's steps)"


def train_transform(fuse: bool) -> Any:
    """torchvision's ImageNet train recipe: stoker.vision's fused ``Compose``, or as
    torchvision runs it (its own classes where it imports)."""
    module = TORCHVISION[1] if TORCHVISION and not fuse else transforms
    steps = [module.RandomResizedCrop(224), module.RandomHorizontalFlip(), module.ToTensor(),
             module.Normalize(mean=MEAN, std=STD)]
    return transforms.Compose(steps, fuse=fuse) if module is transforms else module.Compose(steps)


def _folder_dataset(root: str, fuse: bool) -> Any:
    module = TORCHVISION[0] if TORCHVISION and not fuse else datasets
    return module.ImageFolder(root, train_transform(fuse))


class ShardSample:
    """A `TarShards` transform: the sample's JPEG through the pipeline, its class as an int."""

    def __init__(self, fuse: bool) -> None:
        self.compose = train_transform(fuse)

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        image = sample["jpg"]
        if not isinstance(self.compose, transforms.Compose):  # torchvision's takes an image
            from PIL import Image

            image = Image.open(io.BytesIO(image)).convert("RGB")
        return self.compose(image), int(sample["cls"])


class ColumnTransform:
    """A `set_transform` function: each row's image through the pipeline."""

    def __init__(self, fuse: bool) -> None:
        self.compose = train_transform(fuse)

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"pixel_values": [self.compose(image) for image in batch["image"]],
                "label": batch["label"]}


def image_folder(paths: list[Path], root: Path) -> Path:
    """``root/c<k>/<i>.jpg`` links to ``paths``, in ``CLASSES`` classes (made once)."""
    done = root / ".complete"
    if not done.exists():
        for i, path in enumerate(paths):
            folder = root / f"c{i % CLASSES}"
            folder.mkdir(parents=True, exist_ok=True)
            link = folder / f"{i:05d}.jpg"
            if not link.exists():
                os.symlink(path, link)
        done.touch()
    return root


def tar_shards(paths: list[Path], root: Path, shards: int = 4) -> list[str]:
    """The JPEGs in ``shards`` plain tars, members ``<i>.jpg`` and ``<i>.cls`` (made once)."""
    root.mkdir(parents=True, exist_ok=True)
    names = [str(root / f"shard-{k:02d}.tar") for k in range(shards)]
    if not (root / ".complete").exists():
        per = -(-len(paths) // shards)
        for k, name in enumerate(names):
            with tarfile.open(name, "w") as tar:
                for i in range(k * per, min(len(paths), (k + 1) * per)):
                    tar.add(str(paths[i]), arcname=f"{i:05d}.jpg")
                    label = root / f".{i}.cls"
                    label.write_text(str(i % CLASSES))
                    tar.add(str(label), arcname=f"{i:05d}.cls")
                    label.unlink()
        (root / ".complete").touch()
    return names


def _variants(paths: list[Path], cache: Path) -> list[tuple[str, Callable[[bool], Any]]]:
    folder = image_folder(paths, cache / "folder")
    shards = tar_shards(paths, cache / "shards")
    variants: list[tuple[str, Callable[[bool], Any]]] = [
        ("ImageFolder", lambda fuse: _folder_dataset(str(folder), fuse)),
        ("TarShards", lambda fuse: _tar_dataset(shards, fuse)),
    ]
    try:
        import datasets as hf
    except ImportError:
        print("# vision: Hugging Face datasets not installed (pip install datasets): its "
              "variant skipped", flush=True)
        return variants
    table = hf.Dataset.from_dict(
        {"image": [str(p) for p in paths], "label": [i % CLASSES for i in range(len(paths))]}
    ).cast_column("image", hf.Image())

    def column(fuse: bool) -> Any:
        # stoker's side: the one line besides the import, so the Compose gets the file
        ds = table if not fuse else table.cast_column("image", hf.Image(decode=False))
        ds.set_transform(ColumnTransform(fuse))
        return ds

    variants.append(("datasets Image column", column))
    return variants


def _tar_dataset(shards: list[str], fuse: bool) -> Any:
    from stoker.formats import TarShards

    return TarShards(shards, transform=ShardSample(fuse))


def run(ctx: Context) -> list[dict[str, Any]]:
    images = 64 if ctx.quick else 2000
    cache = Path(tempfile.gettempdir()) / f"stoker-bench-vision-n{images}"
    paths = make_jpeg_files(Path(tempfile.gettempdir()) / f"stoker-bench-jpeg-n{images}", images)
    if ctx.quick:
        kwargs = {"batch_size": 16, "shuffle": True, "num_workers": 2}
        plan, rounds = Plan(epochs=1, warmup_batches=1), 1
    else:
        kwargs = {"batch_size": 64, "shuffle": True, "num_workers": 2}
        plan, rounds = Plan(epochs=2, warmup_batches=4), 2
    records: list[dict[str, Any]] = []
    for variant, make in _variants(paths, cache):
        for r in range(rounds):
            round_records = []
            for position, name in enumerate(_loader_order(ctx)):
                fuse = name != "torch"  # torch's loader: the pipeline as torchvision runs it
                dataset = make(fuse)
                record: dict[str, Any] = {"workload": "vision",
                                          "variant": f"{variant}, round {r + 1}"}
                record.update(measure(ctx, name, dataset, kwargs, plan))
                record.update(
                    dataset=type(dataset).__name__, images=images, run_position=position,
                    pipeline="stoker.vision, fused" if fuse else AS_WRITTEN,
                    loader_kwargs={k: repr(v) for k, v in kwargs.items()},
                )
                round_records.append(record)
            records += _finish(ctx, round_records, None)
    return records
