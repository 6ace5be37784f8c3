"""JPEG to a random-resized-cropped, maybe flipped ``uint8`` CHW image, written in place.

One call does what torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` +
``PILToTensor`` do, faster, by doing less:

* **decode to a smaller target in the DCT domain**: libjpeg-turbo can decode at M/8 scale
  (M = 1..8) by dropping high DCT coefficients, so an image whose crop will be shrunk anyway is
  decoded at the smallest scale that still gives the crop at least the output's size (a crop of
  300 px to 224 px decodes at 6/8). With ``simplejpeg`` (extra ``fastimage``) every eighth is
  available and its fast integer DCT is used; without it, Pillow's ``draft`` (1/2, 1/4, 1/8);
* **crop and resize fused**: one resize reads the crop straight out of the decoded image, no
  copy of the crop (OpenCV's bilinear when installed: after the scaled decode the remaining
  factor is below 8/7, where bilinear needs no antialiasing; Pillow's resize with a ``box``
  otherwise);
* **flip and layout in the final copy**: the resized HWC image is copied once into ``out``
  (a ``3 x H x W`` uint8 tensor, e.g. ``batch[i]`` of a preallocated batch), mirrored when the
  draw says so.

The crop box comes from ``random_resized_crop_box`` (torchvision's distribution), drawn in the
full image's coordinates before decoding, from the ``rng`` given (``stoker.sample_rng()`` in a
``__getitem__``: the same crops under any executor), then the flip from the same ``rng``.
"""

from __future__ import annotations

import importlib
import io
import math
from typing import Any

import numpy as np
import torch

from stoker.image.crops import random_resized_crop_box


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:  # depends on the fastimage extra
        return None


_simplejpeg: Any = _optional("simplejpeg")  # libjpeg-turbo decode at every eighth, fast DCT
_cv2: Any = _optional("cv2")  # the fastest bilinear resize on CPU


def fast_parts() -> tuple[bool, bool]:
    """Whether this process's image path has simplejpeg (the scaled decode) and OpenCV (the
    resize): what the demo and the doctor report as the decoder used."""
    return _simplejpeg is not None, _cv2 is not None


def decode_crop_into(
    jpeg: bytes,
    out: torch.Tensor,
    rng: np.random.Generator,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_p: float = 0.5,
) -> tuple[int, int, int, int, bool]:
    """Decode ``jpeg``, take a random resized crop, flip it with probability ``flip_p``, and
    write it into ``out`` (``uint8``, shape ``(3, H, W)``, CPU). Returns the crop box in the
    full image (top, left, height, width) and whether it was flipped."""
    _check_out(out)
    width, height = _jpeg_size(jpeg)
    box = random_resized_crop_box(rng, height, width, scale, ratio)
    flip = bool(rng.random() < flip_p)
    decode_box_into(jpeg, out, box, flip, (height, width))
    return (*box, flip)


def decode_box_into(
    jpeg: bytes,
    out: torch.Tensor,
    box: tuple[int, int, int, int],
    flip: bool = False,
    size: tuple[int, int] | None = None,
) -> None:
    """Decode the ``box`` (top, left, height, width) of ``jpeg`` resized to ``out``'s size."""
    _check_out(out)
    height, width = size if size is not None else _jpeg_size(jpeg)[::-1]
    out_h, out_w = int(out.shape[1]), int(out.shape[2])
    top, left, crop_h, crop_w = box
    # Decode at the smallest scale where the crop still covers the output (never below 1/8).
    need = max(out_h / crop_h, out_w / crop_w)
    image, factor = _decode_scaled(jpeg, height, width, need)
    y0, x0 = top * factor[0], left * factor[1]
    y1, x1 = (top + crop_h) * factor[0], (left + crop_w) * factor[1]
    resized = _resize_box(image, (x0, y0, x1, y1), (out_w, out_h))
    if flip:
        resized = resized[:, ::-1]
    out.numpy()[...] = resized.transpose(2, 0, 1)


def _check_out(out: torch.Tensor) -> None:
    if out.dtype != torch.uint8 or out.dim() != 3 or out.shape[0] != 3 or out.device.type != "cpu":
        raise ValueError(
            f"out: a {tuple(out.shape)} {out.dtype} tensor on {out.device}; expected a CPU "
            "torch.uint8 tensor of shape (3, height, width), e.g. batch[i] of "
            "torch.empty((n, 3, 224, 224), dtype=torch.uint8)"
        )


def _turbo(data: bytes) -> bool:
    """Whether simplejpeg decodes ``data``: a JPEG, with the extra installed. Anything else
    (a PNG saved as .JPEG, as ImageNet has; WebP; garbage) goes to Pillow, as without it."""
    return _simplejpeg is not None and bool(_simplejpeg.is_jpeg(data))


def _pillow_open(data: bytes) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        raise ValueError(
            f"{len(data)} bytes starting {bytes(data[:8])!r} are not an image Pillow can "
            "read (JPEG, PNG, WebP, ...): check what this sample's field holds"
        ) from exc


def _jpeg_size(jpeg: bytes) -> tuple[int, int]:
    """(width, height) from the header, without decoding."""
    if _turbo(jpeg):
        h, w, _, _ = _simplejpeg.decode_jpeg_header(jpeg)
        return int(w), int(h)
    with _pillow_open(jpeg) as im:
        return im.size


def _decode_scaled(
    jpeg: bytes, height: int, width: int, need: float
) -> tuple[Any, tuple[float, float]]:
    """The image decoded at a reduced scale >= ``need`` (or full): an HWC RGB array (or a
    Pillow image without simplejpeg), and the factors (decoded / full) of height and width."""
    if _turbo(jpeg):
        min_h = min(height, math.ceil(height * need))
        min_w = min(width, math.ceil(width * need))
        array = _simplejpeg.decode_jpeg(
            jpeg, colorspace="RGB", fastdct=True, fastupsample=True,
            min_height=min_h, min_width=min_w,
        )
    else:
        with _pillow_open(jpeg) as im:  # draft: a JPEG's scaled decode; others ignore it
            im.draft("RGB", (math.ceil(width * need), math.ceil(height * need)))
            decoded = im.convert("RGB")
        return decoded, _scale(decoded.height, decoded.width, height, width)
    return array, _scale(array.shape[0], array.shape[1], height, width)


def _scale(decoded_h: int, decoded_w: int, height: int, width: int) -> tuple[float, float]:
    """The decode scale M/8 of both sides. Not decoded / full: the decoder rounds each side up
    (``ceil(side * M/8)``), which would misplace the box by up to a decoded pixel at its far
    edge; every 8 pixels of a side become exactly M."""
    decoded, full = (decoded_w, width) if width >= height else (decoded_h, height)
    f = round(decoded * 8 / full) / 8
    return f, f


def _resize_box(image: Any, box: tuple[float, float, float, float], size: tuple[int, int]) -> Any:
    """The ``box`` (x0, y0, x1, y1, float pixels) of ``image`` resized to ``size`` (w, h)."""
    x0, y0, x1, y1 = box
    if _cv2 is not None and isinstance(image, np.ndarray):
        # The box rounded to whole decoded pixels (at most half a decoded pixel off, under a
        # tenth of an output pixel after the scaled decode), then one bilinear resize.
        ix0, iy0 = max(0, round(x0)), max(0, round(y0))
        ix1 = max(ix0 + 1, min(image.shape[1], round(x1)))
        iy1 = max(iy0 + 1, min(image.shape[0], round(y1)))
        return _cv2.resize(image[iy0:iy1, ix0:ix1], size, interpolation=_cv2.INTER_LINEAR)
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    # Pillow's resize antialiases whatever factor is left (a PNG is not scaled at decode),
    # which OpenCV's bilinear would not.
    return np.asarray(image.resize(size, Image.Resampling.BILINEAR, box=box))
