"""The fused decode's tensor ending: when a ``ToTensor`` (or ``PILToTensor``) follows the fused
crop or resize, with only ``RandomHorizontalFlip`` between, the image never becomes a PIL image.

NOTE [ The fused decode's tensor ending ]
A train list is ``RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize``. Run as
written, the crop's resize is Pillow's (about two thirds of a millisecond for a 224 output here),
and the decoded array is copied into a PIL image and back out of it. When the transforms up to
the first ``ToTensor`` / ``PILToTensor`` are the fused front and exact
``RandomHorizontalFlip``\\ s, the front instead resizes the decoded array as a uint8 tensor with
torch's antialiased resize (``interpolate(antialias=True)``, written to give Pillow's result:
here at most 2 levels of 255 apart, mean 0.04), the flips run as written on that tensor
(torchvision's ``hflip`` of a tensor: the same ``torch.rand(1)`` draw, the same mirror), and the
conversion gives what it gives a PIL image of the same pixels: ``ToTensor`` a contiguous
``CxHxW`` tensor of the default float dtype scaled by ``1/255`` (the same ``to`` and ``div``),
``PILToTensor`` a ``CxHxW`` view of an ``HxWxC`` uint8 copy (its layout). A ``Normalize`` right
after ``ToTensor`` runs in place on its result (as written it would clone it first, then
``sub_`` and ``div_`` the clone: the same operations on the same values, one copy fewer). The
transforms after those run as written.

The geometry: at full scale the region is the crop's integer box, as ``F.crop`` cuts it. At a
reduced DCT scale, ``Resize`` (with its ``CenterCrop``) resizes the whole decoded image at the
exact scale (decoded size / output size is not it: the decode rounds its sides up) and cuts
the centre, as at full scale. ``RandomResizedCrop``'s box scaled by M/8 starts between decoded
pixels, and torch's resize starts at a whole one; so the resize starts a few output pixels
early, from the whole pixel where some output pixel falls within ``MISS`` of a decoded pixel's
edge, and those pixels are cut off (``scaled_region``). The decode scale is the smallest of
1/8, 1/4, 1/2 that covers the output and has such a start, else the full scale
(``decode_scale``).
Without simplejpeg, Pillow's draft scales (1/2, 1/4, 1/8) are what they are, and a box they
misplace is resized by Pillow from the box as it is. docs/vision.md gives the measured bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stoker.vision.transforms import _functional as F
from stoker.vision.transforms._convert import Normalize, PILToTensor, ToTensor
from stoker.vision.transforms._geometry import RandomHorizontalFlip


@dataclass(frozen=True)
class TensorEnding:
    """The flips between the fused front and the conversion, the conversion itself, and the
    index of the first transform after it."""

    flips: tuple[RandomHorizontalFlip, ...]
    convert: ToTensor | PILToTensor
    end: int
    normalize: Normalize | None = None  # right after ToTensor: done in place on its result


def ending_for(transforms: Any, start: int) -> TensorEnding | None:
    """The tensor ending of ``transforms`` after a fused front of ``start`` transforms, or None
    (exact types only: a subclass may draw or convert its own way)."""
    flips = []
    for i in range(start, len(transforms)):
        t = transforms[i]
        if type(t) is RandomHorizontalFlip:
            flips.append(t)
        elif type(t) is PILToTensor:
            return TensorEnding(tuple(flips), t, i + 1)
        elif type(t) is ToTensor:
            after = transforms[i + 1] if i + 1 < len(transforms) else None
            if type(after) is Normalize:
                return TensorEnding(tuple(flips), t, i + 2, after)
            return TensorEnding(tuple(flips), t, i + 1)
        else:
            return None
    return None


def resized(array: np.ndarray, region: tuple[int, int, int, int], size: tuple[int, int],
            mode: str, scales: tuple[float, float] | None = None) -> torch.Tensor:
    """``array[y0:y1, x0:x1]`` (``HxWx3`` uint8) resized to ``size`` (h, w) with torch's
    antialiased ``mode``: a ``3xHxW`` uint8 tensor. ``scales`` (output pixels per input pixel,
    h and w) maps the region's first pixel to the output's first one at that scale, when the
    region is not exactly what the output covers (a reduced-scale decode)."""
    y0, x0, y1, x1 = region
    chw = torch.from_numpy(array).permute(2, 0, 1)[:, y0:y1, x0:x1]
    if scales is None and (y1 - y0, x1 - x0) == size:
        return chw  # torchvision's resize gives the same image back
    # Channels-last in memory: torch's vectorised uint8 path (about 4x Pillow's resize here).
    batch = chw.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    op = getattr(torch._C._nn, f"_upsample_{mode}2d_aa", None)
    if scales is not None and op is not None:
        return op(batch, list(size), False, scales[0], scales[1])[0]
    out = torch.nn.functional.interpolate(batch, size=list(size), mode=mode, antialias=True)
    return out[0]


#: Output pixels computed before a reduced-scale crop's first: at least ``_MARGIN`` (so the
#: filter of the first kept one reads the pixels before the box, as Pillow's does, up to
#: bicubic's reach) and at most ``_MARGIN + _CHOICES``.
_MARGIN, _CHOICES = 3, 8


def _axis(start: float, step: float, limit: int) -> tuple[float, int, int]:
    """(miss, first decoded pixel, output pixels before the crop's) of one axis: the box
    starts at decoded coordinate ``start``, ``step`` decoded pixels per output pixel. Resizing
    from a whole pixel ``a`` with ``k`` output pixels before the box's first puts that one at
    ``a + k * step``; of the ``k`` allowed, the one whose ``a`` misses ``start`` least. At the
    image's edge (``a`` = 0) no margin is needed: both filters stop there."""
    best = (2.0, 0, 0)
    for k in range(_MARGIN + _CHOICES + 1):
        origin = start - k * step
        if origin < -0.5:
            break
        a = min(max(math.floor(origin + 0.5), 0), limit - 1)
        if k >= _MARGIN or a == 0:
            best = min(best, (abs(origin - a), k, a))
    return best


def scaled_region(box: tuple[int, int, int, int], f: float, size: tuple[int, int],
                  height: int, width: int) -> tuple[float, tuple[int, int, int, int],
                                                    tuple[int, int]]:
    """Where to resize from for the (top, left, h, w) ``box`` of the full image in an image
    decoded at scale ``f`` (``height x width``) to ``size``: how far (in decoded pixels) the
    crop lands from where it should, an integer region, and how many output pixels (rows,
    columns) come before the box's first. A box scaled by ``f`` starts between decoded pixels;
    resizing from the nearest whole pixel would shift the crop by up to half a decoded pixel,
    a few output pixels earlier shift it by a fraction of that."""
    top, left, h, w = box
    step_y, step_x = h * f / size[0], w * f / size[1]
    miss_y, ky, y0 = _axis(top * f, step_y, height)
    miss_x, kx, x0 = _axis(left * f, step_x, width)
    y1 = min(height, y0 + math.ceil((size[0] + ky + _MARGIN) * step_y) + 1)
    x1 = min(width, x0 + math.ceil((size[1] + kx + _MARGIN) * step_x) + 1)
    return max(miss_y, miss_x), (y0, x0, y1, x1), (ky, kx)


def decode_scale(box: tuple[int, int, int, int], full: tuple[int, int],
                 size: tuple[int, int]) -> int:
    """The M of the M/8 scale to decode ``box`` of a ``full`` (h, w) JPEG at for ``size``: the
    smallest of the fast scales (``_FAST_SCALES``) whose decode still covers ``size`` and
    places the crop within ``MISS`` of a decoded pixel, else 8 (full scale, always exact)."""
    _, _, h, w = box
    first = max(1, math.ceil(8 * max(size[0] / h, size[1] / w)))
    for m in _FAST_SCALES:
        if m < first:
            continue
        decoded = (math.ceil(full[0] * m / 8), math.ceil(full[1] * m / 8))
        if scaled_region(box, m / 8, size, *decoded)[0] <= MISS:
            return m
    return 8


#: The scales libjpeg-turbo decodes faster than the full image: 1/8, 1/4 and 1/2. Its other
#: M/8 take a slower IDCT: here 5/8, 6/8 and 7/8 took 0.50, 0.57 and 0.69 ms against the full
#: decode's 0.41 (500x375 photos, one core), so those crops decode at full scale.
_FAST_SCALES = (1, 2, 4)


def fast_scale(need: float) -> float:
    """The smallest fast scale (``_FAST_SCALES``, or 1) that is at least ``need``."""
    return next((m / 8 for m in _FAST_SCALES if m / 8 >= need), 1.0)


#: How far, in decoded pixels, a reduced-scale crop may land from its box (NOTE above).
MISS = 0.1


def finish(image: torch.Tensor, ending: TensorEnding) -> torch.Tensor:
    """The flips as written on the uint8 ``CxHxW`` image, then the conversion's result for
    the PIL image of the same pixels."""
    for flip in ending.flips:
        image = flip(image)
    if type(ending.convert) is PILToTensor:
        return image.permute(1, 2, 0).contiguous().permute(2, 0, 1)  # its layout: HWC memory
    out = torch.empty(image.shape, dtype=torch.get_default_dtype())
    out.copy_(image)  # ToTensor's to(dtype), into a contiguous CxHxW tensor
    out.div_(255)
    if ending.normalize is None:
        return out
    # Normalize as written on a copy of ToTensor's result: the same in-place sub_ and div_
    # (and the same checks); ``out`` is that copy already.
    norm = ending.normalize
    return F.normalize(out, norm.mean, norm.std, inplace=True)
