"""DecodeImages on the CPU path (Pillow; torchvision's GPU path is in tests/gpu): encoded
lists become uint8 N x 3 x size x size, crops come from the batch's seed through
random_resized_crop_boxes, other leaves pass through."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import stoker
from stoker.device import feed
from stoker.image.crops import random_resized_crop_boxes
from stoker.image.gpu_decode import DecodeImages


def encoded(h: int, w: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def reference(data: bytes, box: tuple[int, int, int, int], size: int) -> torch.Tensor:
    img = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy())
    top, left, h, w = box
    patch = img.permute(2, 0, 1)[None, :, top:top + h, left:left + w].float()
    out = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False,
                        antialias=True)
    return out[0].round().clamp(0, 255).to(torch.uint8)


def test_crops_come_from_the_batch_seed_in_order():
    images = [encoded(40, 60, seed=1), encoded(50, 30, seed=2), encoded(33, 33, seed=3)]
    feed._BATCH.seed, feed._BATCH.device = 1234, None
    try:
        out = DecodeImages(size=16)({"img": images, "label": torch.tensor([1, 2, 3])})
    finally:
        feed._BATCH.seed = None
    assert out["img"].shape == (3, 3, 16, 16) and out["img"].dtype == torch.uint8
    assert torch.equal(out["label"], torch.tensor([1, 2, 3]))
    sizes = [Image.open(io.BytesIO(data)).size[::-1] for data in images]
    boxes = random_resized_crop_boxes(np.random.default_rng(1234), sizes)
    for k, (data, box) in enumerate(zip(images, boxes, strict=True)):
        assert torch.equal(out["img"][k], reference(data, box, 16)), f"image {k}"


def test_center_and_whole_image_crops_and_jpeg():
    jpeg = encoded(48, 64, fmt="JPEG")
    center = DecodeImages(size=24, crop="center")([jpeg])
    assert torch.equal(center[0], reference(jpeg, (0, 8, 48, 48), 24))
    whole = DecodeImages(size=24, crop="none")([jpeg])
    assert torch.equal(whole[0], reference(jpeg, (0, 0, 48, 64), 24))


def test_bad_arguments_say_what_to_change():
    with pytest.raises(ValueError) as err:
        DecodeImages(crop="random")
    assert str(err.value) == ("DecodeImages(crop='random'): expected one of "
                              "('random_resized', 'center', 'none').")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError) as err2:
            DecodeImages(decode_on="cuda")
        assert str(err2.value) == (
            "DecodeImages(decode_on='cuda') needs torchvision (pip install "
            "'stoker[gpu-decode]', matching your torch build) and a CUDA device; use "
            "decode_on='auto' to fall back to Pillow on the CPU."
        )


def test_exported():
    assert stoker.image.DecodeImages is DecodeImages
