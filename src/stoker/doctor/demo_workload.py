"""The demo's workload: synthetic photo-like JPEG files and a map-style dataset that decodes
them with Pillow and applies an ImageNet-style augmentation (RandomResizedCrop + flip), written
as a torchvision user would write it, drawing from the ``random`` module that both loaders seed
per worker. Needs the `demo` extra (Pillow): ``pip install 'stoker[demo]'``.

The same dataset on stoker's image path (``ImagePathJpegDataset``: one line of
``__getitem__`` changed to ``stoker.image.decode_crop_into``) and the transform that reads the
same files packed into tar shards (``DecodeCropSample``) are the demo's other tiers."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CROP_SIZE = 224
_MANIFEST = "manifest.json"
_NUM_CLASSES = 10


# ---------------------------------------------------------------------------------------------
# Synthetic JPEG files
# ---------------------------------------------------------------------------------------------


def _synthetic_image(rng: np.random.Generator) -> Image.Image:
    """A photo-sized image (256..500 x 256..375) with smooth colour regions plus grain, so it
    compresses and decodes like a natural photo rather than like pure noise."""
    width = int(rng.integers(256, 501))
    height = int(rng.integers(256, 376))
    coarse = rng.integers(0, 256, size=(height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8)
    smooth = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    grain = rng.integers(-12, 13, size=(height, width, 3), dtype=np.int16)
    pixels = np.clip(np.asarray(smooth, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def make_jpeg_files(root: str | os.PathLike[str], count: int, seed: int = 0) -> list[str]:
    """Write `count` synthetic JPEGs (PIL quality 90) under `root` and return their paths.

    The set is cached: a manifest written last records (count, seed), and a later call with
    the same arguments on the same `root` returns the existing files without rewriting them.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    root_path = Path(root)
    manifest = root_path / _MANIFEST
    wanted = {"count": count, "seed": seed, "version": 1}
    names = [f"img_{i:06d}.jpg" for i in range(count)]
    if manifest.exists():
        try:
            if json.loads(manifest.read_text(encoding="utf-8")) == wanted and all(
                (root_path / name).exists() for name in names
            ):
                return [str(root_path / name) for name in names]
        except (OSError, ValueError):
            pass  # unreadable manifest: regenerate below
    root_path.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    for name in names:
        _synthetic_image(rng).save(root_path / name, format="JPEG", quality=90)
    manifest.write_text(json.dumps(wanted), encoding="utf-8")
    return [str(root_path / name) for name in names]


# ---------------------------------------------------------------------------------------------
# Augmentation and dataset
# ---------------------------------------------------------------------------------------------


def random_resized_crop_box(
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    rng: random.Random | None = None,
) -> tuple[int, int, int, int]:
    """The (left, upper, right, lower) box RandomResizedCrop would cut from a width x height
    image: a random area fraction in `scale` and log-uniform aspect ratio in `ratio`, ten
    tries, then a centre crop clamped to `ratio` (torchvision's sampling, in pure Python).

    Draws from the `random` module unless `rng` is given, so loader worker seeding applies.
    """
    draw = rng if rng is not None else random
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * draw.uniform(scale[0], scale[1])
        aspect = math.exp(draw.uniform(log_lo, log_hi))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = draw.randint(0, height - h)
            left = draw.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def decode_and_augment(
    path: str, size: int = CROP_SIZE, rng: random.Random | None = None
) -> torch.Tensor:
    """Decode a JPEG with PIL, random-resized-crop it to size x size, flip it horizontally
    half the time, and return a uint8 CHW tensor (like torchvision's PILToTensor). Draws
    from the `random` module unless `rng` is given."""
    draw = rng if rng is not None else random
    with Image.open(path) as img:
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        box = random_resized_crop_box(rgb.width, rgb.height, rng=rng)
        out = rgb.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if draw.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(out)).permute(2, 0, 1)


class JpegDataset(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Map-style dataset over JPEG files: ``dataset[i] -> (uint8 [3, 224, 224], label)``."""

    def __init__(self, paths: Sequence[str], size: int = CROP_SIZE) -> None:
        self.paths = list(paths)
        self.labels = [i % _NUM_CLASSES for i in range(len(self.paths))]
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return decode_and_augment(self.paths[index], self.size), self.labels[index]


# ---------------------------------------------------------------------------------------------
# The same samples on stoker's image path
# ---------------------------------------------------------------------------------------------


def _decode_crop(data: bytes, size: int) -> torch.Tensor:
    """The image path's one line: decode, random-resized-crop and flip straight into ``out``,
    drawing from the sample's own generator (the same crops under any executor)."""
    from stoker import sample_rng
    from stoker.image import decode_crop_into

    out = torch.empty((3, size, size), dtype=torch.uint8)
    decode_crop_into(data, out, sample_rng())
    return out


class ImagePathJpegDataset(JpegDataset):
    """``JpegDataset`` with the decode on stoker's image path: the same files, labels and
    output (uint8 [3, size, size], label); needs a stoker loader (``stoker.sample_rng()``)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with open(self.paths[index], "rb") as f:
            data = f.read()
        return _decode_crop(data, self.size), self.labels[index]


class DecodeCropSample:
    """``TarShards``' transform for a pack of the demo's files: the sample's ``jpg`` bytes on
    the image path, its ``cls`` as the label (a class, so it pickles into workers)."""

    def __init__(self, size: int = CROP_SIZE) -> None:
        self.size = size

    def __call__(self, sample: dict[str, bytes]) -> tuple[torch.Tensor, int]:
        return _decode_crop(sample["jpg"], self.size), int(sample["cls"])
