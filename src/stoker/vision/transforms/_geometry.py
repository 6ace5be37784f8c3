"""The geometric transforms: ``RandomResizedCrop``, ``Resize``, ``CenterCrop``,
``RandomHorizontalFlip``, with torchvision's v1 signatures, defaults, random draws and output.

The random parameters come from torch's global generator in torchvision's order and with its
calls: ``RandomResizedCrop`` up to 10 tries of ``torch.empty(1).uniform_(*scale)`` (area) and
``torch.exp(torch.empty(1).uniform_(*log(ratio)))`` (aspect ratio, the logs as float32), the
first box whose rounded sides fit placed with two ``torch.randint``, else the ratio-clamped
center crop; ``RandomHorizontalFlip`` one ``torch.rand(1) < p``. The same seed gives the same
boxes and flips as torchvision, and leaves the generator in the same state.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from stoker.vision.transforms import _functional as F
from stoker.vision.transforms._modes import InterpolationMode, interpolation_mode

_TWO_DIMENSIONS = "Please provide only two dimensions (h, w) for size."


def setup_size(size: Any, error_msg: str) -> tuple[int, int] | Sequence[int]:
    """torchvision's ``_setup_size``: a number is a square, one value too."""
    if isinstance(size, numbers.Number):
        return int(size), int(size)  # type: ignore[call-overload]
    if isinstance(size, Sequence) and len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError(error_msg)
    return size  # type: ignore[no-any-return]


def crop_params(
    height: int, width: int, scale: Sequence[float], ratio: Sequence[float]
) -> tuple[int, int, int, int]:
    """``RandomResizedCrop.get_params`` for a ``height x width`` image: (top, left, h, w)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(
            torch.empty(1).uniform_(log_ratio[0], log_ratio[1])  # type: ignore[arg-type]
        ).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    # Fallback to a central crop, its ratio clamped to the range.
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # the whole image
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop(torch.nn.Module):
    """A crop of random area (``scale`` of the image's) and aspect ratio (``ratio``), resized
    to ``size``: torchvision's ``RandomResizedCrop``, the same boxes from the same seed.

    In a ``stoker.vision.transforms.Compose`` given a JPEG (a path or bytes) it is the
    transform fused with the decode: only the crop is decoded, at the smallest fast DCT scale
    that still covers ``size`` (docs/vision.md)."""

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: InterpolationMode | int = InterpolationMode.BILINEAR,
        antialias: bool | None = True,
    ) -> None:
        super().__init__()
        self.size = setup_size(size, error_msg=_TWO_DIMENSIONS)
        if not isinstance(scale, Sequence):
            raise TypeError("Scale should be a sequence")
        if not isinstance(ratio, Sequence):
            raise TypeError("Ratio should be a sequence")
        if (scale[0] > scale[1]) or (ratio[0] > ratio[1]):
            F.warn_as_torchvision("Scale and ratio should be of kind (min, max)")
        self.interpolation = interpolation_mode(interpolation)
        self.antialias = antialias
        self.scale = scale
        self.ratio = ratio

    @staticmethod
    def get_params(
        img: Any, scale: Sequence[float], ratio: Sequence[float]
    ) -> tuple[int, int, int, int]:
        """(top, left, height, width) of a random crop of ``img``, drawn as torchvision draws."""
        _, height, width = F.get_dimensions(img)
        return crop_params(height, width, scale, ratio)

    def forward(self, img: Any) -> Any:
        top, left, h, w = self.get_params(img, self.scale, self.ratio)
        img = F.crop(img, top, left, h, w)
        return F.resize(img, list(self.size), self.interpolation, antialias=self.antialias)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(size={self.size}"
            f", scale={tuple(round(s, 4) for s in self.scale)}"
            f", ratio={tuple(round(r, 4) for r in self.ratio)}"
            f", interpolation={self.interpolation.value}, antialias={self.antialias})"
        )


class Resize(torch.nn.Module):
    """Resize to ``size``: ``(h, w)``, or the shorter side to an int (the longer as
    ``int(size * long / short)``, capped by ``max_size``): torchvision's ``Resize``.

    First in a ``Compose`` given a JPEG, it is fused with the decode (with a ``CenterCrop``
    after it, only the crop is resized)."""

    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: InterpolationMode | int = InterpolationMode.BILINEAR,
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        super().__init__()
        if not isinstance(size, (int, Sequence)):
            raise TypeError(f"Size should be int or sequence. Got {type(size)}")
        if isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError("If size is a sequence, it should have 1 or 2 values")
        self.size = size
        self.max_size = max_size
        self.interpolation = interpolation_mode(interpolation)
        self.antialias = antialias

    def output_size(self, height: int, width: int) -> list[int]:
        """``[h, w]`` this resize gives a ``height x width`` image."""
        sizes = F.resize_size_list(self.size, self.max_size)
        return F.resized_output_size(height, width, sizes, self.max_size)

    def forward(self, img: Any) -> Any:
        return F.resize(img, self.size, self.interpolation, self.max_size, self.antialias)

    def __repr__(self) -> str:
        detail = (
            f"(size={self.size}, interpolation={self.interpolation.value}, "
            f"max_size={self.max_size}, antialias={self.antialias})"
        )
        return f"{self.__class__.__name__}{detail}"


class CenterCrop(torch.nn.Module):
    """The central ``size`` region (``int(round((h - th) / 2.0))`` from the top), zero-padded
    first when the image is smaller: torchvision's ``CenterCrop``."""

    def __init__(self, size: int | Sequence[int]) -> None:
        super().__init__()
        self.size = setup_size(size, error_msg=_TWO_DIMENSIONS)

    def forward(self, img: Any) -> Any:
        return F.center_crop(img, self.size)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(size={self.size})"


class RandomHorizontalFlip(torch.nn.Module):
    """Mirror left-right when ``torch.rand(1) < p``: torchvision's ``RandomHorizontalFlip``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, img: Any) -> Any:
        if torch.rand(1) < self.p:
            return F.hflip(img)
        return img

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(p={self.p})"
