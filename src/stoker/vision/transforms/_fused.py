"""Decode only what the first transforms keep: a JPEG decoded at reduced scale, cropped and
resized in one step, for a ``Compose`` given a path or bytes.

NOTE [ Fused decode in Compose ]
A ``Compose`` whose first transform is ``RandomResizedCrop``, or ``Resize`` (optionally followed
by ``CenterCrop``), and which is given an encoded JPEG, does not decode the whole image and then
crop it. It reads the size from the JPEG header, draws the crop exactly as the transform would
(the same torch RNG calls in the same order, ``geometry.crop_params``), then decodes at the
smallest DCT scale of 1/8, 1/4 and 1/2 whose image still covers the output, else at full scale
(libjpeg-turbo through simplejpeg, else Pillow's ``draft``; libjpeg-turbo's other M/8 scales are
slower than the whole image: ``_fused_tensor._FAST_SCALES``) and resizes the crop's region of
that smaller image with Pillow's filter (``Image.resize(box=...)``). The transforms after those
run as written, on the result, so a flip's ``torch.rand(1)`` is drawn after the crop's draws as
before, and dtypes and layouts are theirs. When a ``ToTensor`` / ``PILToTensor`` follows (flips
between), the resize is torch's on a uint8 tensor instead and the image never becomes a PIL
image (NOTE [ The fused decode's tensor ending ] in ``_fused_tensor.py``).

What stays the same: the random draws and the RNG state after each sample, the output's size,
mode and (after ``ToTensor`` etc.) dtype and layout. When the decode needs the full scale (the
crop is no larger than the output) the steps are torchvision's own on the full decode, with the
same decoder (accurate DCT, fancy upsampling, as Pillow decodes), so the pixels are equal. When
it decodes at a reduced scale, the DCT scaling replaces part of the antialiased resize: the
pixels differ within that rounding (docs/vision.md has the measured bound).

Not fused, run as written on Pillow's decode: anything not a JPEG in YCbCr or grayscale (PNG,
CMYK, ...), a filter other than bilinear or bicubic, ``antialias=False``, a ``CenterCrop``
larger than the resized image, and a JPEG the fast decoder refuses (then the RNG state from
before the draws is restored first, so the as-written run draws the same).
"""

from __future__ import annotations

import importlib
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stoker.vision._io import JPEG_START, pil_image_module
from stoker.vision.transforms import _functional as F
from stoker.vision.transforms import _fused_tensor as T
from stoker.vision.transforms._geometry import CenterCrop, RandomResizedCrop, Resize, crop_params
from stoker.vision.transforms._modes import PIL_FILTERS, InterpolationMode

_FUSED_MODES = (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
_COLOR_SPACES = ("YCbCr", "Gray")  # decoded to RGB as Pillow decodes them


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:  # the fastimage extra
        return None


_simplejpeg: Any = _optional("simplejpeg")


@dataclass(frozen=True)
class FusedPlan:
    """The transforms the decode replaces: a ``RandomResizedCrop``, or a ``Resize`` and maybe
    a ``CenterCrop``; ``consumed`` of them, from the front of the list. With an ``ending``, the
    flips and the tensor conversion after them run on a uint8 tensor (NOTE [ The fused
    decode's tensor ending ])."""

    crop: RandomResizedCrop | None = None
    resize: Resize | None = None
    center: CenterCrop | None = None
    ending: T.TensorEnding | None = None

    @property
    def consumed(self) -> int:
        return 1 if self.crop is not None else 1 + (self.center is not None)


def _fusable(t: RandomResizedCrop | Resize) -> bool:
    return t.interpolation in _FUSED_MODES and t.antialias is not False


def plan_for(transforms: Any) -> FusedPlan | None:
    """The fused plan for a list of transforms, or None when its front is not one (exact
    types only: a subclass may draw or resize its own way)."""
    if len(transforms) == 0:
        return None
    first = transforms[0]
    if type(first) is RandomResizedCrop and _fusable(first):
        return FusedPlan(crop=first, ending=T.ending_for(transforms, 1))
    if type(first) is Resize and _fusable(first):
        second = transforms[1] if len(transforms) > 1 else None
        center = second if type(second) is CenterCrop else None
        ending = T.ending_for(transforms, 1 + (center is not None))
        return FusedPlan(resize=first, center=center, ending=ending)
    return None


def jpeg_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(height, width) from the header of a JPEG that decodes to RGB as Pillow decodes it, or
    None for anything else."""
    if bytes(data[:3]) != JPEG_START:
        return None
    if _simplejpeg is not None:
        try:
            height, width, color_space, _ = _simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return None
        return (int(height), int(width)) if color_space in _COLOR_SPACES else None
    try:
        with pil_image_module().open(io.BytesIO(data)) as im:
            ok = im.format == "JPEG" and im.mode in ("RGB", "L")
            return (im.height, im.width) if ok else None
    except (OSError, ValueError, SyntaxError):
        return None


def decode_scaled(
    data: bytes | bytearray | memoryview, height: int, width: int, need: float,
    as_array: bool = False,
) -> Any:
    """The RGB image decoded at the smallest scale whose sides are at least ``need`` times the
    full ones (the full image when ``need >= 1``), as a PIL image (``as_array``: an ``HxWx3``
    writable uint8 array)."""
    image_module = pil_image_module()
    if _simplejpeg is not None:
        need = T.fast_scale(need)
        array = _simplejpeg.decode_jpeg(
            data, colorspace="RGB", fastdct=False, fastupsample=False,  # as Pillow decodes
            min_height=min(height, math.ceil(height * need)),
            min_width=min(width, math.ceil(width * need)),
        )
        return array if as_array else image_module.fromarray(array)
    with image_module.open(io.BytesIO(data)) as im:
        if need < 1:
            im.draft("RGB", (math.ceil(width * need), math.ceil(height * need)))
        image = im.convert("RGB")
    return np.array(image) if as_array else image


def run(plan: FusedPlan, data: bytes | bytearray | memoryview) -> tuple[Any, int] | None:
    """The image the plan's transforms would give the decoded ``data`` and the index of the
    first transform still to run on it, or None when it is not a JPEG this path decodes
    (nothing drawn: the caller runs the transforms as written)."""
    size = jpeg_size(data)
    if size is None:
        return None
    if plan.crop is None:
        try:
            image = _resize_center(plan, data, *size)
        except (ValueError, OSError):
            return None
        return None if image is None else _result(plan, image)
    state = torch.get_rng_state()
    box = crop_params(size[0], size[1], plan.crop.scale, plan.crop.ratio)
    try:
        image = _crop_resized(plan, data, size, box)
    except (ValueError, OSError):
        torch.set_rng_state(state)  # the as-written run draws the same box
        return None
    return _result(plan, image)


def _result(plan: FusedPlan, image: Any) -> tuple[Any, int]:
    if plan.ending is None:
        return image, plan.consumed
    return T.finish(image, plan.ending), plan.ending.end


def _dct_scale(decoded_h: int, decoded_w: int, height: int, width: int) -> float:
    """The scale M/8 an image was decoded at (each side ``ceil(side * M/8)``).

    Not ``decoded / full``: the rounded-up size would misplace a region by up to half a
    decoded pixel at the far edge; every 8 pixels of a side become exactly M."""
    decoded, full = (decoded_w, width) if width >= height else (decoded_h, height)
    return round(decoded * 8 / full) / 8


def _crop_resized(
    plan: FusedPlan, data: Any, size: tuple[int, int], box: tuple[int, int, int, int]
) -> Any:
    crop = plan.crop
    assert crop is not None
    (height, width), (top, left, h, w) = size, box
    out_h, out_w = crop.size[0], crop.size[1]
    need = max(out_h / h, out_w / w)
    if plan.ending is not None:
        return _crop_resized_tensor(crop, data, size, box)
    image = decode_scaled(data, height, width, need)
    if image.size == (width, height):  # full scale: torchvision's own steps
        image = F.crop(image, top, left, h, w)
        return F.resize(image, [out_h, out_w], crop.interpolation, antialias=crop.antialias)
    f = _dct_scale(image.height, image.width, height, width)
    region = (left * f, top * f, (left + w) * f, (top + h) * f)
    return image.resize((out_w, out_h), PIL_FILTERS[crop.interpolation], box=region)


def _crop_resized_tensor(
    crop: RandomResizedCrop, data: Any, size: tuple[int, int], box: tuple[int, int, int, int]
) -> torch.Tensor:
    """``_crop_resized`` as a uint8 ``CxHxW`` tensor, resized by torch (NOTE [ The fused
    decode's tensor ending ])."""
    (height, width), (top, left, h, w) = size, box
    out_h, out_w = crop.size[0], crop.size[1]
    mode = crop.interpolation.value
    if _simplejpeg is not None:  # the fast scale that places the crop closely enough
        need = T.decode_scale(box, size, (out_h, out_w)) / 8
    else:  # Pillow's draft: 1/2, 1/4, 1/8
        need = max(out_h / h, out_w / w)
    array = decode_scaled(data, height, width, need, as_array=True)
    ah, aw = array.shape[:2]
    if (ah, aw) == (height, width):
        return T.resized(array, (top, left, top + h, left + w), (out_h, out_w), mode)
    f = _dct_scale(ah, aw, height, width)
    miss, region, (ky, kx) = T.scaled_region(box, f, (out_h, out_w), ah, aw)
    if miss > T.MISS:  # a draft scale that misplaces it: Pillow's resize takes the box as is
        image = pil_image_module().fromarray(array).resize(
            (out_w, out_h), PIL_FILTERS[crop.interpolation],
            box=(left * f, top * f, (left + w) * f, (top + h) * f))
        return T.resized(np.array(image), (0, 0, out_h, out_w), (out_h, out_w), mode)
    out = T.resized(array, region, (out_h + ky, out_w + kx), mode,
                    (out_h / (h * f), out_w / (w * f)))
    return out[:, ky:, kx:]


def _resize_center(plan: FusedPlan, data: Any, height: int, width: int) -> Any:
    resize = plan.resize
    assert resize is not None
    new_h, new_w = resize.output_size(height, width)
    if plan.center is None:
        top, left, out_h, out_w = 0, 0, new_h, new_w
    else:
        out_h, out_w = plan.center.size[0], plan.center.size[1]
        pad, (top, left) = F.center_crop_box(new_h, new_w, out_h, out_w)
        if any(pad):
            return None  # padded: as written
    need = max(new_h / height, new_w / width)
    if plan.ending is not None:  # the whole (decoded) image resized, then the centre cut
        array = decode_scaled(data, height, width, need, as_array=True)
        ah, aw = array.shape[:2]
        f = _dct_scale(ah, aw, height, width)
        scales = None if (ah, aw) == (height, width) else (new_h / (height * f),
                                                           new_w / (width * f))
        whole = T.resized(array, (0, 0, ah, aw), (new_h, new_w), resize.interpolation.value,
                          scales)
        return whole[:, top:top + out_h, left:left + out_w]
    image = decode_scaled(data, height, width, need)
    if image.size == (width, height):  # full scale: torchvision's own steps
        image = resize(image)
        return image if plan.center is None else plan.center(image)
    f = _dct_scale(image.height, image.width, height, width)
    fy, fx = f * height / new_h, f * width / new_w  # decoded pixels per resized pixel
    region = (left * fx, top * fy, (left + out_w) * fx, (top + out_h) * fy)
    return image.resize((out_w, out_h), PIL_FILTERS[resize.interpolation], box=region)
