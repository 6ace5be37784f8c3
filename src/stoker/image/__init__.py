"""The fast image path: crop boxes drawn like torchvision's ``RandomResizedCrop``, and JPEG
decode at reduced scale with crop, resize and flip fused, written straight into a batch."""

import typing as _typing

from stoker._core.lazy_exports import lazy_exports as _lazy_exports

# NOTE [ Import only what the loader needs ]
_LAZY = {
    "DecodeImages": "stoker.image.gpu_decode",
    "decode_box_into": "stoker.image.decode",
    "decode_crop_into": "stoker.image.decode",
    "random_resized_crop_box": "stoker.image.crops",
}
__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)

if _typing.TYPE_CHECKING:
    from stoker.image.crops import random_resized_crop_box
    from stoker.image.decode import decode_box_into, decode_crop_into
    from stoker.image.gpu_decode import DecodeImages

__all__ = ["DecodeImages", "decode_box_into", "decode_crop_into", "random_resized_crop_box"]
