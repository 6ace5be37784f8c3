"""What ``stoker pack`` packs: a sample as (key, {field: bytes}), from an image folder or from
any map-style dataset, checked against the rules tar readers split member names by, and the
optional re-encoding of images to a maximum side.

NOTE [ Keys and fields in a tar ]
    A sample is written as members ``<key>.<field>``; readers (stoker's, WebDataset's) split a
    member name at the first dot of its last path part, lower-case the field, skip hidden and
    ``__meta__``-style names, and start a new sample when the key changes. So a key with a dot
    in its last part (``img.0``, ``5.0``) would be read back as another key, two adjacent
    samples with one key as one sample, a sample without fields as no sample, and fields
    ``JPG`` and ``jpg`` as one field. ``pack`` refuses such samples, naming them, instead of
    writing shards that read back different; fields are written lower-cased.

NOTE [ Resizing with --max-side ]
    Every image field of a sample is resized by the same factor, so an image and its mask stay
    aligned. Photos are resampled bicubically; label images with nearest-neighbour, which
    keeps their values (bicubic turns labels {0, 5, 10} into 0..10). A label image is one in
    mode P, 1, I, I;16 or F, or one in a lossless format (png, bmp, tif, ppm) in a field named
    with a prefix (``seg.png``, ``mask.png``): a directory pack's fields are bare extensions
    (its files are photos), a Dataset names its masks. EXIF (orientation) and ICC profiles are
    kept; animated images are stored unchanged (resizing would keep one frame).
"""

from __future__ import annotations

import io
import json
import os
import re
import traceback
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from stoker.errors import PackError
from stoker.formats._common import require
from stoker.formats.image_folder import list_images
from stoker.sharing.shared_list import SharedStrList

IMAGE_FORMATS = {
    "jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP", "tif": "TIFF",
    "tiff": "TIFF", "ppm": "PPM", "pgm": "PPM",
}
LOSSY_FORMATS = ("JPEG", "WEBP")
LABEL_MODES = ("P", "1", "I", "F")  # and I;16*: values, not light
ORIENTATION = 0x0112  # the EXIF tag readers rotate by
RESAMPLE_RULE = "bicubic; nearest for modes P, 1, I, I;16, F and for lossless prefixed fields"
_META_FIELD = re.compile(r"__.*__")


class _BadSample(ValueError):
    """A sample breaks a packing rule; the message says which and what to change."""


class Records(Protocol):
    def __len__(self) -> int: ...

    def record(self, index: int, jpeg_quality: int) -> tuple[str, dict[str, bytes]]: ...

    def where(self, index: int) -> str: ...

    def describe(self) -> dict[str, Any]: ...


def shown(path: str) -> str:
    """A file name printable on any terminal (undecodable bytes as ``\\xe9``)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class FolderRecords:
    """An ImageFolder tree: each file's bytes under its extension, its label as ``cls``, its
    path relative to the root as ``path.txt`` (the name's bytes). Keys are sample numbers (file
    names may hold dots: NOTE [ Keys and fields in a tar ])."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        paths, self.labels, self.classes = list_images(self.root)
        self.paths = SharedStrList(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def record(self, index: int, jpeg_quality: int) -> tuple[str, dict[str, bytes]]:
        path = self.paths[index]
        with open(os.path.join(self.root, path), "rb") as f:
            data = f.read()
        ext = path.rsplit(".", 1)[-1].lower()
        # fsencode: a name that is not UTF-8 comes back as the bytes it has on disk
        fields = {ext: data, "cls": str(self.labels[index]).encode(), "path.txt": os.fsencode(path)}
        return f"{index:09d}", fields

    def where(self, index: int) -> str:
        return f"sample {index} ({shown(os.path.join(self.root, self.paths[index]))})"

    def describe(self) -> dict[str, Any]:
        return {"kind": "image_folder", "root": self.root, "samples": len(self),
                "classes": list(self.classes)}


class DatasetRecords:
    """A map-style dataset's samples: a dict maps field names (extensions) to values; a tuple
    or list needs ``fields``, one name per element. ``"__key__"`` in a dict sets the key; other
    ``__name__`` entries (a reader's ``__url__``) are metadata and not packed."""

    def __init__(self, dataset: Any, fields: Sequence[str] | None, name: str) -> None:
        self.dataset, self.fields, self.name = dataset, tuple(fields or ()), name
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def record(self, index: int, jpeg_quality: int) -> tuple[str, dict[str, bytes]]:
        items = self._items(self.dataset[index])
        key = check_key(items.pop("__key__", f"{index:09d}"))
        values = {name: value for name, value in items.items() if not _is_meta(name)}
        if not values:
            raise _BadSample(
                f"it has no fields ({sorted(map(str, items))}); every sample needs at least "
                "one, such as {'jpg': jpeg_bytes} (a sample without members reads back as none)"
            )
        fields = {}
        for name, value in values.items():
            field = check_field(name)
            if field in fields:
                raise _BadSample(
                    f"fields {sorted(n for n in values if str(n).lower() == field)} differ "
                    "only by case; readers lower-case field names: rename one of them"
                )
            fields[field] = encode_field(field, value, jpeg_quality)
        return key, fields

    def _items(self, sample: Any) -> dict[Any, Any]:
        if isinstance(sample, dict):
            return dict(sample)
        if isinstance(sample, (tuple, list)) and len(sample) == len(self.fields):
            return dict(zip(self.fields, sample, strict=True))
        kind = f"a {type(sample).__name__}"
        if isinstance(sample, (tuple, list)):
            kind += f" of {len(sample)} elements"
        raise _BadSample(
            f"it is {kind}; stoker pack needs a dict of {{extension: value}} (e.g. "
            "{'jpg': jpeg_bytes, 'cls': 3}), or a tuple with one field name per element: "
            f"fields=('jpg', 'cls') (--fields jpg,cls); fields given: {list(self.fields)}"
        )

    def where(self, index: int) -> str:
        return f"sample {index} of {self.name}"

    def describe(self) -> dict[str, Any]:
        return {"kind": "dataset", "name": self.name, "samples": len(self)}


def _is_meta(name: Any) -> bool:
    return isinstance(name, str) and _META_FIELD.fullmatch(name) is not None


def check_key(key: Any) -> str:
    """A ``__key__`` the readers give back unchanged (NOTE [ Keys and fields in a tar ])."""
    if not isinstance(key, str):
        raise _BadSample(
            f"its __key__ {key!r} is of type {type(key).__name__}; give a str (keys name tar "
            "members), without a dot in its last part, e.g. f'{index:09d}'"
        )
    parts = key.split("/")
    problem = (
        "is empty or has an empty path part (a leading, trailing or double '/')" if not all(
            parts) else
        "holds a NUL character" if "\0" in key else
        "has a path part starting with '.' (hidden, or '..'), which readers skip or "
        "extract outside their directory" if any(p.startswith(".") for p in parts) else
        "has a dot in its last path part: readers split the member name there, so it would "
        f"read back as {parts[-1].split('.')[0]!r}"
        if "." in parts[-1] else
        "starts with a __name__ part, which readers skip as metadata" if _is_meta(parts[0])
        else None
    )
    if problem:
        raise _BadSample(
            f"its __key__ {key!r} {problem}; give it a key such as 'img_0' or 'train/000001'"
        )
    return key


def check_field(name: Any) -> str:
    """A field name as readers give it back: lower-case, no path, no leading dot."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name or (
            name.startswith(".")):
        raise _BadSample(
            f"field name {name!r} cannot name a tar member (<key>.<field>); use an extension "
            "such as 'jpg', 'cls' or 'seg.png'"
        )
    return name.lower()


def encode_field(name: str, value: Any, jpeg_quality: int) -> bytes:
    """A field's value as bytes, by type (and, for images, by the field's extension)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return str(value.item() if isinstance(value, np.generic) else value).encode()
    image_format = IMAGE_FORMATS.get(name.rsplit(".", 1)[-1])
    if image_format is not None and isinstance(value, (np.ndarray, torch.Tensor)):
        return _save(_array_image(name, value, image_format), name, image_format, jpeg_quality)
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
    if image_format is not None and hasattr(value, "save"):  # a PIL image
        return _save(value, name, image_format, jpeg_quality)
    raise _BadSample(
        f"field {name!r}: cannot store a {type(value).__name__}; give bytes, str, a number, a "
        "numpy array (.npy), a tensor (.pth), a dict or list (.json), or a PIL image or uint8 "
        "array under an image extension (jpg, png, webp)"
    )


def _array_image(name: str, value: Any, image_format: str) -> Any:
    """A uint8 tensor (CHW, as torchvision) or array (HWC, as PIL and OpenCV) as a PIL image;
    a uint16 one (one channel) too, for the formats that hold 16 bits (png, tif)."""
    pil = require("PIL.Image", "image", "stoker pack of an array as an image")
    is_tensor = isinstance(value, torch.Tensor)
    array = value.detach().cpu().numpy() if is_tensor else value
    if is_tensor and array.ndim == 3:
        array = array.transpose(1, 2, 0)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    fits = (array.dtype == np.uint8 and (array.ndim == 2 or (
        array.ndim == 3 and array.shape[2] in (3, 4)))) or (
        array.dtype == np.uint16 and array.ndim == 2 and image_format in ("PNG", "TIFF"))
    if not fits:
        layout = "(C, H, W) tensor" if is_tensor else "(H, W, C) array"
        raise _BadSample(
            f"field {name!r}: a {value.dtype} {type(value).__name__} of shape "
            f"{tuple(value.shape)} is not an image to store as {image_format}; give uint8 as a "
            f"{layout} with 1, 3 or 4 channels (or (H, W)), or store it under 'npy' or 'pth'"
        )
    return pil.fromarray(np.ascontiguousarray(array))


def _save(image: Any, name: str, image_format: str, jpeg_quality: int, **extra: Any) -> bytes:
    out = io.BytesIO()
    options = {"quality": jpeg_quality} if image_format in LOSSY_FORMATS else {}
    try:
        image.save(out, format=image_format, **options, **extra)
    except (OSError, KeyError, ValueError) as exc:
        raise _BadSample(
            f"field {name!r}: a mode {image.mode} image cannot be saved as {image_format} "
            f"({exc}); convert it first (e.g. image.convert('RGB')) or use a field of a format "
            "that holds it (png)"
        ) from exc
    return out.getvalue()


def packed_record(records: Records, index: int, max_side: int | None, jpeg_quality: int
                  ) -> tuple[str, dict[str, bytes]]:
    """Sample ``index`` as written: read, encoded, checked, resized. Any failure is a
    ``PackError`` naming the sample (and file) and the cause."""
    try:
        key, fields = records.record(index, jpeg_quality)
        if max_side:
            fields = {n: shrink_image(n, d, max_side, jpeg_quality) for n, d in fields.items()}
        return key, fields
    except _BadSample as exc:
        raise PackError(f"{records.where(index)}: {exc}") from exc
    except Exception as exc:  # the dataset's own code, or a file's bytes
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise PackError(
            f"{records.where(index)}: {type(exc).__name__}: {exc} (at "
            f"{frame.filename}:{frame.lineno} in {frame.name})"
        ) from exc


def shrink_image(name: str, data: bytes, max_side: int, jpeg_quality: int) -> bytes:
    """An image field re-encoded so that its longer side is at most ``max_side`` (aspect kept,
    same format, NOTE [ Resizing with --max-side ]); smaller and animated images and non-image
    fields are returned unchanged."""
    prefix, _, ext = name.rpartition(".")
    image_format = IMAGE_FORMATS.get(ext)
    if image_format is None:
        return data
    pil = require("PIL.Image", "image", "stoker pack --max-side")
    try:
        image = pil.open(io.BytesIO(data))
    except (OSError, ValueError) as exc:
        raise _BadSample(
            f"field {name!r} is not an image Pillow can read ({type(exc).__name__}), so "
            "--max-side cannot resize it"
        ) from exc
    with image:
        width, height = image.size
        if max(width, height) <= max_side or getattr(image, "n_frames", 1) > 1:
            return data
        scale = max_side / max(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        label = image.mode in LABEL_MODES or image.mode.startswith("I;16") or (
            bool(prefix) and image_format not in LOSSY_FORMATS)
        if image_format == "JPEG":
            image.draft(image.mode, size)  # libjpeg's DCT-domain downscale first: much faster
        resample = pil.Resampling.NEAREST if label else pil.Resampling.BICUBIC
        resized = image.resize(size, resample, reducing_gap=None if label else 3.0)
        return _save(resized, name, image_format, jpeg_quality, **_kept_info(image, image_format))


def _kept_info(image: Any, image_format: str) -> dict[str, Any]:
    """What re-encoding keeps: the ICC profile, EXIF (orientation), transparency."""
    kept: dict[str, Any] = {}
    if image.info.get("icc_profile") and image_format != "BMP" and image_format != "PPM":
        kept["icc_profile"] = image.info["icc_profile"]
    exif = image.getexif()
    if exif and image_format in ("JPEG", "PNG", "WEBP"):
        kept["exif"] = exif.tobytes()
    elif exif.get(ORIENTATION) and image_format == "TIFF":  # its IFD holds the old size too
        kept["exif"] = {ORIENTATION: exif[ORIENTATION]}
    if "transparency" in image.info and image_format == "PNG":
        kept["transparency"] = image.info["transparency"]
    if image_format == "TIFF" and image.info.get("compression") in ("tiff_lzw", "packbits",
                                                                    "tiff_adobe_deflate"):
        kept["compression"] = image.info["compression"]
    return kept
