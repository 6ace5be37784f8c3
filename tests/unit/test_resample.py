"""stoker.image.resample against torch's own antialiased bilinear interpolation of each crop
(NOTE [ A batch resized as two matmuls ]): the same pixels up to float32 summation order, for
downscaling and upscaling crops, crops touching every edge, images of different sizes in one
batch, and batches split into parts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stoker.image import resample
from stoker.image.crops import random_resized_crop_box


def _per_image(images: list[torch.Tensor], boxes: list[tuple[int, int, int, int]],
               size: int) -> torch.Tensor:
    out = []
    for img, (top, left, h, w) in zip(images, boxes, strict=True):
        patch = img[None, :, top:top + h, left:left + w].float()
        out.append(F.interpolate(patch, size=(size, size), mode="bilinear",
                                 align_corners=False, antialias=True))
    return torch.cat(out)


def _images(shapes: list[tuple[int, int]], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8) for h, w in shapes]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-3  # float32 sums taken in another order
    rounded = (got.round() - want.round()).abs()
    assert rounded.max().item() <= 1 and rounded.mean().item() < 1e-3


@pytest.mark.parametrize("size", [224, 32, 7])
def test_random_crops_of_one_size_match_interpolate(size: int) -> None:
    images = _images([(75, 100)] * 12)
    rng = np.random.default_rng(size)
    boxes = [random_resized_crop_box(rng, 75, 100) for _ in images]
    _close(resample.crop_resize_batch(images, boxes, size), _per_image(images, boxes, size))


def test_edges_whole_images_one_pixel_and_mixed_sizes() -> None:
    images = _images([(40, 60), (61, 33), (5, 9), (40, 60), (1, 1)], seed=1)
    boxes = [(0, 0, 40, 60), (60, 0, 1, 33), (0, 8, 5, 1), (13, 21, 27, 39), (0, 0, 1, 1)]
    for size in (16, 50):
        _close(resample.crop_resize_batch(images, boxes, size),
               _per_image(images, boxes, size))


def test_a_batch_split_into_parts_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    images = _images([(30, 20)] * 5 + [(20, 30)] * 2, seed=2)
    boxes = [(2, 3, 20, 15)] * 5 + [(0, 0, 20, 30)] * 2
    whole = resample.crop_resize_batch(images, boxes, 12)
    monkeypatch.setattr(resample, "_CHUNK_BYTES", 3 * 30 * 30 * 4 * 2)  # two images a part
    assert torch.equal(resample.crop_resize_batch(images, boxes, 12), whole)


def test_weights_are_torchs_rows() -> None:
    """Each row sums to 1 and is zero outside its window inside the span."""
    w = resample.aa_weights(torch.tensor([3, 0]), torch.tensor([10, 4]), 5, 20)
    assert torch.allclose(w.sum(-1), torch.ones(2, 5))
    assert (w[0, :, :3] == 0).all() and (w[0, :, 13:] == 0).all()
    assert (w[1, :, 4:] == 0).all()


def test_bad_input_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="2 images but 1 boxes"):
        resample.crop_resize_batch(_images([(4, 4)] * 2), [(0, 0, 4, 4)], 2)
    with pytest.raises(ValueError, match="no images"):
        resample.crop_resize_batch([], [], 2)
