"""What ``stoker pack`` packs: a sample as (key, {field: bytes}), from an image folder or from
any map-style dataset, and the optional re-encoding of images to a maximum side."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from stoker.formats._common import require
from stoker.formats.image_folder import list_images
from stoker.sharing.shared_list import SharedStrList

IMAGE_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


class Records(Protocol):
    def __len__(self) -> int: ...

    def record(self, index: int) -> tuple[str, dict[str, bytes]]: ...

    def describe(self) -> dict[str, Any]: ...


class FolderRecords:
    """An ImageFolder tree: each file's bytes under its extension, its label as ``cls``, its
    path relative to the root as ``path.txt``. Keys are sample numbers (file names may hold
    dots, which WebDataset's key rule would split)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        paths, self.labels, self.classes = list_images(self.root)
        self.paths = SharedStrList(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def record(self, index: int) -> tuple[str, dict[str, bytes]]:
        path = self.paths[index]
        with open(os.path.join(self.root, path), "rb") as f:
            data = f.read()
        ext = path.rsplit(".", 1)[-1].lower()
        fields = {ext: data, "cls": str(self.labels[index]).encode(), "path.txt": path.encode()}
        return f"{index:09d}", fields

    def describe(self) -> dict[str, Any]:
        return {"kind": "image_folder", "root": self.root, "samples": len(self),
                "classes": list(self.classes)}


class DatasetRecords:
    """A map-style dataset's samples: a dict maps field names (extensions) to values; a tuple
    or list needs ``fields``, one name per element. ``"__key__"`` in a dict sets the key."""

    def __init__(self, dataset: Any, fields: Sequence[str] | None, name: str) -> None:
        self.dataset, self.fields, self.name = dataset, tuple(fields or ()), name
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def record(self, index: int) -> tuple[str, dict[str, bytes]]:
        sample = self.dataset[index]
        if isinstance(sample, dict):
            items = dict(sample)
        elif isinstance(sample, (tuple, list)) and len(sample) == len(self.fields):
            items = dict(zip(self.fields, sample, strict=True))
        else:
            kind = f"a {type(sample).__name__}"
            if isinstance(sample, (tuple, list)):
                kind += f" of {len(sample)} elements"
            raise TypeError(
                f"sample {index} of {self.name} is {kind}; stoker pack needs a dict of "
                "{extension: value} (e.g. {'jpg': jpeg_bytes, 'cls': 3}), or a tuple with "
                f"one field name per element: fields=('jpg', 'cls') (--fields jpg,cls); "
                f"fields given: {list(self.fields)}"
            )
        key = str(items.pop("__key__", f"{index:09d}"))
        return key, {name: encode_field(name, value, index) for name, value in items.items()}

    def describe(self) -> dict[str, Any]:
        return {"kind": "dataset", "name": self.name, "samples": len(self)}


def encode_field(name: str, value: Any, index: int) -> bytes:
    """A field's value as bytes, by type (and, for images, by the field's extension)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(
            f"sample {index}: field name {name!r} cannot name a tar member; use an extension "
            "such as 'jpg', 'cls' or 'seg.png'"
        )
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return str(value.item() if isinstance(value, np.generic) else value).encode()
    if isinstance(value, np.ndarray):
        out = io.BytesIO()
        np.save(out, value, allow_pickle=False)
        return out.getvalue()
    if isinstance(value, torch.Tensor):
        out = io.BytesIO()
        torch.save(value, out)
        return out.getvalue()
    if isinstance(value, (dict, list)):
        return json.dumps(value).encode()
    image_format = IMAGE_FORMATS.get(name.rsplit(".", 1)[-1].lower())
    if image_format is not None and hasattr(value, "save"):  # a PIL image
        out = io.BytesIO()
        value.save(out, format=image_format)
        return out.getvalue()
    raise TypeError(
        f"sample {index}, field {name!r}: cannot store a {type(value).__name__}; give bytes, "
        "str, a number, a numpy array (.npy), a tensor (.pth), a dict or list (.json), or a "
        "PIL image under an image extension (jpg, png, webp)"
    )


def shrink_image(name: str, data: bytes, max_side: int, jpeg_quality: int) -> bytes:
    """An image field re-encoded so that its longer side is at most ``max_side`` (aspect kept,
    same format); smaller images and non-image fields are returned unchanged."""
    image_format = IMAGE_FORMATS.get(name.rsplit(".", 1)[-1].lower())
    if image_format is None:
        return data
    pil = require("PIL.Image", "image", "stoker pack --max-side")
    with pil.open(io.BytesIO(data)) as image:
        width, height = image.size
        if max(width, height) <= max_side:
            return data
        scale = max_side / max(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        if image_format == "JPEG":
            image.draft(image.mode, size)  # libjpeg's DCT-domain downscale first: much faster
        resized = image.resize(size, pil.Resampling.BICUBIC, reducing_gap=3.0)
        out = io.BytesIO()
        options = {"quality": jpeg_quality} if image_format in ("JPEG", "WEBP") else {}
        resized.save(out, format=image_format, **options)
        return out.getvalue()
