"""Encoded images as ``stoker.vision`` receives them, and Pillow's decode of them.

What a transform may be given instead of a decoded image: a path (``str`` / ``os.PathLike``,
what ``ImageFolder`` hands a fused ``Compose``), the bytes of a file (``bytes``, ``bytearray``,
``memoryview``: a ``TarShards`` / ``TarShardStream`` sample's image member), or a Hugging Face
``datasets`` ``Image`` value cast with ``decode=False`` (``{"bytes": ..., "path": ...}``).
Decoded as torchvision's ``default_loader`` decodes a file: Pillow, converted to RGB.
"""

from __future__ import annotations

import io
import os
from types import ModuleType
from typing import Any, Union

Encoded = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]
JPEG_START = b"\xff\xd8\xff"


def encoded_image(value: Any) -> Encoded | None:
    """``value`` as a path or bytes of an image file, or None when it is neither."""
    if isinstance(value, (str, os.PathLike, bytes, bytearray, memoryview)):
        return value
    if isinstance(value, dict) and set(value) == {"bytes", "path"}:
        data, path = value["bytes"], value["path"]
        if data is not None:
            return encoded_image(data)
        if path is not None:
            return encoded_image(path)
        raise ValueError(
            "an image value {'bytes': None, 'path': None} holds no image: a datasets Image "
            "column needs the file's bytes or its path in each row"
        )
    return None


def pil_image_module() -> ModuleType:
    """``PIL.Image``, or an ImportError naming the extra that installs Pillow."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(
            "stoker.vision decodes images with Pillow, which is not installed. Install it "
            "with: pip install 'stoker[image]'"
        ) from exc
    return Image


def pil_loader(path: str | os.PathLike[str]) -> Any:
    """torchvision's ``pil_loader``: the file opened with Pillow, converted to RGB."""
    image_module = pil_image_module()
    # The file object, not the path: no ResourceWarning (Pillow issue 835), torchvision's errors.
    with open(path, "rb") as f:
        img = image_module.open(f)
        return img.convert("RGB")


def decode(source: Encoded) -> Any:
    """A path or bytes decoded as ``pil_loader`` decodes a file."""
    if isinstance(source, (str, os.PathLike)):
        return pil_loader(source)
    return pil_image_module().open(io.BytesIO(source)).convert("RGB")
