"""torchvision's image datasets and transforms on stoker's image path: change
``from torchvision import datasets, transforms`` to ``from stoker.vision import datasets,
transforms``. Same class names, signatures, defaults and random draws; a JPEG given to a
``transforms.Compose`` (by ``datasets.ImageFolder``, or as bytes from tar shards or a
``datasets`` column) is decoded fused with its first crop or resize (docs/vision.md)."""

import typing as _typing

from stoker._core.lazy_exports import lazy_exports as _lazy_exports

# NOTE [ Import only what the loader needs ]
_LAZY = {"datasets": "", "transforms": ""}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)

if _typing.TYPE_CHECKING:
    from stoker.vision import datasets, transforms

__all__ = ["datasets", "transforms"]
