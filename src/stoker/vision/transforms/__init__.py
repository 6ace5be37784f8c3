"""torchvision's image transforms (v1) under the same names, signatures and defaults, with a
``Compose`` that decodes a JPEG fused with its first crop or resize.

``from torchvision import transforms`` -> ``from stoker.vision import transforms``: each class
gives torchvision's output on PIL images and tensors, and draws its random parameters from
torch's generator with torchvision's calls (the same boxes and flips for the same seed). A
``Compose`` given a path or bytes decodes them (Pillow, RGB, as torchvision's
``default_loader``); for a JPEG whose list starts with ``RandomResizedCrop`` or ``Resize`` [+
``CenterCrop``], only what those keep is decoded (NOTE [ Fused decode in Compose ]).
"""

from stoker.vision.transforms._compose import FUSE_ENV, Compose
from stoker.vision.transforms._convert import ConvertImageDtype, Normalize, PILToTensor, ToTensor
from stoker.vision.transforms._geometry import (
    CenterCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from stoker.vision.transforms._modes import InterpolationMode

__all__ = [
    "FUSE_ENV",
    "CenterCrop",
    "Compose",
    "ConvertImageDtype",
    "InterpolationMode",
    "Normalize",
    "PILToTensor",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToTensor",
]
