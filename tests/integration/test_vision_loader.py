"""stoker.vision through stoker's loader with 2 worker processes: an ImageFolder with a fused
Compose gives the batches of the same pipeline with fusion off (``fuse=False``, or
``STOKER_VISION_FUSE=0``): the same samples, labels, shapes and dtypes in the same order,
the same random crops and flips (each worker's torch RNG drawn as before), pixels equal
where the decode is at full scale and within docs/vision.md's bound where it is reduced."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker

Image = pytest.importorskip("PIL.Image")

from stoker.vision import datasets  # noqa: E402
from stoker.vision import transforms as T  # noqa: E402

MEAN_BOUND, MAX_BOUND = 4.5, 80  # as tests/unit/test_vision_compose.py and docs/vision.md


def _folder(root: Path, size: tuple[int, int], count: int = 12) -> str:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size[0], 0:size[1]].astype(np.float32)
    for i in range(count):
        shading = np.stack([128 + 100 * np.sin(x / (20 + i)), 128 + 90 * np.cos(y / 17),
                            128 + 60 * np.sin((x + y) / (30 + i))], -1)
        pixels = (shading + rng.normal(0, 3, shading.shape)).clip(0, 255).astype(np.uint8)
        path = root / f"class{i % 3}" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG", quality=90)
        path.write_bytes(out.getvalue())
    (root / "class0" / "extra.png").write_bytes(_png())  # not a JPEG: decoded as written
    return str(root)


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (90, 70), (200, 10, 30)).save(out, "PNG")
    return out.getvalue()


def _batches(root: str, transforms: list, fuse: bool) -> list:
    dataset = datasets.ImageFolder(root, transform=T.Compose(transforms, fuse=fuse))
    loader = stoker.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, timeout=60,
                               generator=torch.Generator().manual_seed(7))
    return list(loader)


def _train() -> list:
    return [T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]


def test_fused_batches_equal_unfused_ones_at_full_scale(tmp_path: Path) -> None:
    root = _folder(tmp_path, (80, 96))  # every crop is at most 96 px: decoded at full scale
    for transforms in (_train(), [T.Resize(96), T.CenterCrop(96), T.PILToTensor()]):
        fused, plain = _batches(root, transforms, True), _batches(root, transforms, False)
        assert len(fused) == len(plain) == 4
        for (x, y), (x0, y0) in zip(fused, plain, strict=True):
            assert torch.equal(y, y0) and x.dtype == x0.dtype and torch.equal(x, x0)


def test_reduced_scale_batches_are_within_the_bound(tmp_path: Path) -> None:
    root = _folder(tmp_path, (375, 500))
    fused, plain = _batches(root, _train(), True), _batches(root, _train(), False)
    for (x, y), (x0, y0) in zip(fused, plain, strict=True):
        assert torch.equal(y, y0) and x.shape == x0.shape == (len(y), 3, 96, 96)
        levels = ((x - x0) * 0.25 * 255).abs()
        assert levels.mean() <= MEAN_BOUND and levels.max() <= MAX_BOUND + 1


def test_the_environment_switch_reaches_the_workers(tmp_path: Path, monkeypatch) -> None:
    root = _folder(tmp_path, (375, 500), count=6)
    plain = _batches(root, _train(), False)
    monkeypatch.setenv(T.FUSE_ENV, "0")
    switched_off = _batches(root, _train(), True)
    for (x, y), (x0, y0) in zip(switched_off, plain, strict=True):
        assert torch.equal(x, x0) and torch.equal(y, y0)
