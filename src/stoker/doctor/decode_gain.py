"""The image path's gain on the user's own JPEGs, measured here, one core, in about a second.

A few of the dataset's files are read (their paths from the attributes datasets keep them in:
``paths``, ``files``, ``samples``/``imgs`` as torchvision's ``ImageFolder``, ...; only files
that start like a JPEG) and decoded both ways, interleaved: Pillow's decode + the same
RandomResizedCrop box + bilinear resize + flip + tensor (what a torchvision ``__getitem__``
does), and ``stoker.image.decode_crop_into``. The ratio of the two is the gain per core; with
no JPEG found the caller says the gain was not measured rather than guessing one.
"""

from __future__ import annotations

import importlib
import io
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from stoker._core.alternating_timing import alternating_ms

_ATTRIBUTES = ("paths", "files", "image_paths", "filenames", "file_paths", "samples", "imgs")
_JPEG = b"\xff\xd8\xff"
_MAX_FILES = 16
_MAX_BYTES = 32 << 20  # a big file is no sample of a training set's images


@dataclass(frozen=True)
class Gain:
    images: int
    size: int
    pillow_ms: float
    image_path_ms: float
    decoder: str

    @property
    def ratio(self) -> float:
        return self.pillow_ms / self.image_path_ms if self.image_path_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def jpeg_samples(dataset: Any, limit: int = _MAX_FILES) -> list[bytes]:
    """Up to ``limit`` of the dataset's JPEG files' bytes, spread over its list of paths."""
    for name in _ATTRIBUTES:
        items = getattr(dataset, name, None)
        if not isinstance(items, (list, tuple)) or not items:
            continue
        step = max(1, len(items) // limit)
        found = [data for item in items[::step][:limit] if (data := _read(item))]
        if found:
            return found
    return []


def _read(item: Any) -> bytes | None:
    path = item[0] if isinstance(item, (list, tuple)) and item else item
    if not isinstance(path, (str, os.PathLike)):
        return None
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, TypeError, ValueError):
        return None
    return data if data.startswith(_JPEG) else None


def decoder() -> str:
    """Which decoder ``decode_crop_into`` uses here (the fastimage extra or Pillow)."""
    from stoker.image.decode import fast_parts

    if all(fast_parts()):
        return "decoder: simplejpeg + OpenCV"
    return ("decoder: Pillow's fallback; pip install 'stoker[fastimage]' (simplejpeg + "
            "OpenCV) for the fast one")


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def measure_gain(jpegs: list[bytes], size: int = 224, budget_s: float = 1.0) -> Gain | None:
    """Both ways over ``jpegs``, alternating, until ``budget_s`` (at least one pass each)."""
    if not jpegs:
        return None
    from stoker.image import decode_crop_into

    cv2 = _module("cv2")
    threads, cv2_threads = torch.get_num_threads(), cv2.getNumThreads() if cv2 else 0
    torch.set_num_threads(1)
    if cv2:
        cv2.setNumThreads(1)
    out = torch.empty((3, size, size), dtype=torch.uint8)
    try:
        pillow_ms, image_path_ms = alternating_ms(
            jpegs, lambda k, data: _pillow(data, out, np.random.default_rng(k)),
            lambda k, data: decode_crop_into(data, out, np.random.default_rng(k)), budget_s)
    finally:
        torch.set_num_threads(threads)
        if cv2:
            cv2.setNumThreads(cv2_threads)
    return Gain(len(jpegs), size, pillow_ms, image_path_ms, decoder())


def _pillow(data: bytes, out: torch.Tensor, rng: np.random.Generator) -> None:
    """Pillow's way: decode, the same crop box, bilinear resize, flip, a CHW tensor."""
    from PIL import Image

    from stoker.image import random_resized_crop_box

    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    top, left, h, w = random_resized_crop_box(rng, rgb.height, rgb.width)
    size = (int(out.shape[2]), int(out.shape[1]))
    resized = rgb.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out.copy_(torch.from_numpy(np.array(resized)).permute(2, 0, 1))
