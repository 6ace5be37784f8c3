"""``ImageFolder``: a directory of images, one subdirectory per class, as a map-style dataset.

torchvision's rules, so the samples and labels are the ones ``torchvision.datasets.ImageFolder``
gives for the same tree: classes are the subdirectory names in sorted order (label = position);
files are found by walking each class directory (following links) in sorted order, keeping
those whose lower-cased name ends with one of ``IMG_EXTENSIONS``; an empty class is an error.
The file list is built once, in the main process, and held in a ``SharedStrList`` (one buffer
workers share, no per-worker copy). Bytes are read through a ``ByteSource``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any, Literal

from torch.utils.data import Dataset

from stoker.formats._common import default_source, require
from stoker.sharing.shared_list import SharedStrList
from stoker.storage import ByteSource

#: The file extensions ``ImageFolder`` reads as images, compared lower-cased: torchvision's
#: ``torchvision.datasets.folder.IMG_EXTENSIONS``.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    if not os.path.isdir(root):
        what = "is a file" if os.path.exists(root) else "does not exist"
        error = NotADirectoryError if os.path.exists(root) else FileNotFoundError
        raise error(
            f"{root} {what}; an image folder is a directory holding one subdirectory per "
            "class (root/cat/001.jpg, root/dog/002.jpg, ...)"
        )
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(
            f"{root}: no class directories; an image folder holds one subdirectory per class "
            "(root/cat/001.jpg, root/dog/002.jpg, ...)"
        )
    return classes, {name: i for i, name in enumerate(classes)}


def list_images(
    root: str, extensions: tuple[str, ...] = IMG_EXTENSIONS
) -> tuple[list[str], list[int], list[str]]:
    """(paths relative to ``root``, labels, classes), in torchvision's order."""
    classes, class_to_idx = find_classes(root)
    paths: list[str] = []
    labels: list[int] = []
    lowered = tuple(e.lower() for e in extensions)
    empty = []
    for name in classes:
        before = len(paths)
        class_dir = os.path.join(root, name)
        for dirpath, _, filenames in sorted(os.walk(class_dir, followlinks=True)):
            for filename in sorted(filenames):
                if filename.lower().endswith(lowered):
                    paths.append(os.path.relpath(os.path.join(dirpath, filename), root))
                    labels.append(class_to_idx[name])
        if len(paths) == before:
            empty.append(name)
    if empty:
        raise FileNotFoundError(
            f"{root}: no files with an extension in {', '.join(extensions)} in the class "
            f"directories {empty}; remove them or pass extensions="
        )
    return paths, labels, classes


def decode_pil(data: bytes) -> Any:
    """JPEG/PNG/... bytes -> an RGB ``PIL.Image`` (torchvision's ``pil_loader``)."""
    image_module = require("PIL.Image", "image", "decoding images")
    with image_module.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


class ImageFolder(Dataset[tuple[Any, int]]):
    """``(image, label)`` per file; ``decode="pil"`` gives an RGB ``PIL.Image`` as torchvision
    does, ``"bytes"`` the file's bytes (decode them yourself, e.g. with a faster decoder)."""

    def __init__(
        self,
        root: str,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        decode: Literal["pil", "bytes"] = "pil",
        extensions: tuple[str, ...] = IMG_EXTENSIONS,
        source: ByteSource | None = None,
    ) -> None:
        if decode not in ("pil", "bytes"):
            raise ValueError(f"decode={decode!r}: expected 'pil' or 'bytes'")
        if decode == "pil":
            require("PIL.Image", "image", "ImageFolder(decode='pil')")
        self.root = root
        self.source = default_source(root, source)
        paths, labels, self.classes = list_images(root, extensions)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.paths = SharedStrList(paths)
        self.targets = labels
        self.transform, self.target_transform, self.decode = transform, target_transform, decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        data = self.source.read(os.path.join(self.root, self.paths[index]))
        image: Any = decode_pil(data) if self.decode == "pil" else data
        target: Any = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
