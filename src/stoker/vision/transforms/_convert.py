"""The conversions: ``ToTensor``, ``PILToTensor``, ``ConvertImageDtype``, ``Normalize``, with
torchvision's v1 signatures and results (dtype, layout, scaling)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from stoker.vision.transforms import _functional as F


class ToTensor:
    """A PIL image or ``HxWxC`` ndarray to a ``CxHxW`` tensor; uint8 data scaled to [0, 1]
    as ``torch.get_default_dtype()``: torchvision's ``ToTensor``."""

    def __call__(self, pic: Any) -> torch.Tensor:
        return F.to_tensor(pic)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"


class PILToTensor:
    """A PIL image to a ``CxHxW`` tensor of its own dtype, unscaled: torchvision's
    ``PILToTensor``."""

    def __call__(self, pic: Any) -> torch.Tensor:
        return F.pil_to_tensor(pic)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"


class ConvertImageDtype(torch.nn.Module):
    """A tensor image to ``dtype``, its values rescaled to the new range: torchvision's
    ``ConvertImageDtype``."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return F.convert_image_dtype(image, self.dtype)


class Normalize(torch.nn.Module):
    """``(input[c] - mean[c]) / std[c]`` per channel of a float tensor image, out of place
    unless ``inplace``: torchvision's ``Normalize``."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        super().__init__()
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return F.normalize(tensor, self.mean, self.std, self.inplace)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(mean={self.mean}, std={self.std})"
