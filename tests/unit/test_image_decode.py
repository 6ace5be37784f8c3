"""decode_crop_into: the crop is random_resized_crop_box's draw (hence torchvision's
distribution, tested in test_image_crops), the pixels are that crop resized, the flip mirrors,
the output lands in the given uint8 CHW slice, and the same seed gives the same image. Run with
and without the optional decoders (simplejpeg, OpenCV): the Pillow-only path must agree too."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL.Image")

import stoker.image.decode as decode  # noqa: E402
from stoker.image import decode_box_into, decode_crop_into, random_resized_crop_box  # noqa: E402


def _jpeg(height: int = 375, width: int = 500, seed: int = 0) -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x * 0.4 % 256, y * 0.6 % 256, (x + y) * 0.3 % 256], -1)
    img = (base + rng.normal(0, 4, base.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    PIL.fromarray(img).save(buf, "JPEG", quality=95)
    return buf.getvalue(), img


@pytest.fixture(params=["fast", "pillow_only"])
def path(request, monkeypatch):
    if request.param == "pillow_only":
        monkeypatch.setattr(decode, "_simplejpeg", None)
        monkeypatch.setattr(decode, "_cv2", None)
    elif decode._simplejpeg is None or decode._cv2 is None:
        pytest.skip("simplejpeg and opencv (the fastimage extra) are not installed")
    return request.param


def _reference(jpeg: bytes, box, flip: bool, size=(224, 224)) -> np.ndarray:
    top, left, h, w = box
    img = PIL.open(io.BytesIO(jpeg)).convert("RGB")
    img = img.resize(size, PIL.BILINEAR, box=(left, top, left + w, top + h))
    arr = np.asarray(img)
    return (arr[:, ::-1] if flip else arr).transpose(2, 0, 1)


def test_writes_the_drawn_crop_resized_into_the_batch_slice(path) -> None:
    jpeg, _ = _jpeg()
    batch = torch.zeros((4, 3, 224, 224), dtype=torch.uint8)
    rng, same = np.random.default_rng(11), np.random.default_rng(11)
    for i in range(4):
        top, left, h, w, flip = decode_crop_into(jpeg, batch[i], rng)
        assert (top, left, h, w) == random_resized_crop_box(same, 375, 500)
        assert flip == bool(same.random() < 0.5)
        diff = np.abs(batch[i].numpy().astype(int) - _reference(jpeg, (top, left, h, w), flip))
        assert diff.mean() < 3.0, (path, (top, left, h, w), diff.mean())
    assert batch.dtype == torch.uint8 and batch.shape == (4, 3, 224, 224)
    assert batch.is_contiguous() and int(batch.float().std()) > 10  # all four were written


def test_flip_mirrors_the_same_crop(path) -> None:
    jpeg, _ = _jpeg()
    plain, flipped = torch.empty(3, 96, 128, dtype=torch.uint8), torch.empty(3, 96, 128,
                                                                             dtype=torch.uint8)
    decode_box_into(jpeg, plain, (30, 40, 200, 300), flip=False)
    decode_box_into(jpeg, flipped, (30, 40, 200, 300), flip=True)
    assert torch.equal(flipped, plain.flip(-1))


def test_scaled_decode_keeps_a_small_crop_of_a_large_image_sharp(path) -> None:
    jpeg, img = _jpeg(1200, 1600, seed=2)
    out = torch.empty(3, 64, 64, dtype=torch.uint8)
    decode_box_into(jpeg, out, (0, 0, 1200, 1600))  # whole image to 64 px: decoded at 1/8
    ref = _reference(jpeg, (0, 0, 1200, 1600), False, size=(64, 64))
    assert np.abs(out.numpy().astype(int) - ref).mean() < 3.0


def test_same_seed_same_pixels(path) -> None:
    jpeg, _ = _jpeg()
    a, b = torch.empty(3, 224, 224, dtype=torch.uint8), torch.empty(3, 224, 224, dtype=torch.uint8)
    assert decode_crop_into(jpeg, a, np.random.default_rng(5)) == decode_crop_into(
        jpeg, b, np.random.default_rng(5))
    assert torch.equal(a, b)


def test_a_wrong_output_says_what_is_expected() -> None:
    jpeg, _ = _jpeg(32, 32)
    with pytest.raises(ValueError) as info:
        decode_crop_into(jpeg, torch.empty(224, 224, 3, dtype=torch.uint8),
                         np.random.default_rng(0))
    assert str(info.value) == (
        "out: a (224, 224, 3) torch.uint8 tensor on cpu; expected a CPU torch.uint8 tensor of "
        "shape (3, height, width), e.g. batch[i] of torch.empty((n, 3, 224, 224), "
        "dtype=torch.uint8)"
    )


@pytest.mark.parametrize("kind", ["PNG", "WEBP"])
def test_an_image_that_is_not_a_jpeg_is_decoded_by_pillow_on_either_path(path, kind) -> None:
    # ImageNet has a PNG saved as .JPEG: with simplejpeg installed it must still decode.
    _, img = _jpeg()
    buf = io.BytesIO()
    PIL.fromarray(img).save(buf, kind, **({"lossless": True} if kind == "WEBP" else {}))
    out = torch.empty(3, 96, 128, dtype=torch.uint8)
    box = (30, 40, 200, 300)
    decode_box_into(buf.getvalue(), out, box, flip=True)
    assert np.abs(out.numpy().astype(int) - _reference(buf.getvalue(), box, True,
                                                       size=(128, 96))).mean() < 3.0
    top, left, h, w, _ = decode_crop_into(buf.getvalue(), out, np.random.default_rng(1))
    assert (top, left, h, w) == random_resized_crop_box(np.random.default_rng(1), 375, 500)


@pytest.mark.parametrize("data", [b"", b"not an image at all"])
def test_bytes_that_are_no_image_say_so(path, data) -> None:
    with pytest.raises(ValueError, match=r"bytes starting .* are not an image Pillow can read"):
        decode_crop_into(data, torch.empty(3, 8, 8, dtype=torch.uint8), np.random.default_rng(0))


def test_a_box_at_the_far_edge_of_a_scaled_decode_lands_where_it_is(path) -> None:
    # 1203 x 1601 at 1/8 decodes to 151 x 201 (each side rounded up), not 150.4 x 200.1: the
    # box is placed by the scale itself, 1/8, or its far edge would be a decoded pixel off.
    jpeg, _ = _jpeg(1203, 1601, seed=3)
    for box in [(403, 801, 800, 800), (0, 801, 1203, 800)]:
        out = torch.empty(3, 64, 64, dtype=torch.uint8)
        decode_box_into(jpeg, out, box)
        ref = _reference(jpeg, box, False, size=(64, 64))
        assert np.abs(out.numpy().astype(int) - ref).mean() < 3.0, box
