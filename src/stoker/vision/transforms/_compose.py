"""``Compose``: torchvision's, plus a path or bytes decoded first, and decoded fused with the
first transforms when they crop or resize a JPEG (NOTE [ Fused decode in Compose ])."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from stoker.vision import _io
from stoker.vision.transforms import _fused
from stoker.vision.transforms._convert import PILToTensor, ToTensor
from stoker.vision.transforms._geometry import (
    CenterCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

#: ``STOKER_VISION_FUSE=0`` (or ``false``, ``no``, ``off``) turns the fused decode off in every
#: ``Compose`` of the process, whatever their ``fuse=`` argument.
FUSE_ENV = "STOKER_VISION_FUSE"
_OFF = ("0", "false", "no", "off")
# The transforms that need a decoded image: a path or bytes given to a Compose starting with
# one of them is decoded first (torchvision's would fail on it). Anything else is passed as is.
_IMAGE_TRANSFORMS = (RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, ToTensor,
                     PILToTensor)


def fusion_allowed() -> bool:
    """Whether ``STOKER_VISION_FUSE`` leaves the fused decode on (unset: on)."""
    return os.environ.get(FUSE_ENV, "1").strip().lower() not in _OFF


class Compose:
    """Several transforms applied in turn: torchvision's ``Compose``, with two additions for
    encoded images.

    Given a path, the bytes of a file (e.g. a ``TarShards`` sample's ``"jpg"`` member) or a
    ``datasets`` ``Image`` value cast with ``decode=False``, and starting with one of
    ``stoker.vision.transforms``' image transforms, it decodes the image first, as
    torchvision's ``default_loader`` does (Pillow, RGB). And when the list starts with
    ``RandomResizedCrop``, or ``Resize`` (with or without ``CenterCrop``), and the image is a
    JPEG, the decode is fused with them: it decodes only what they keep, at reduced scale,
    drawing the same random parameters from torch's generator (NOTE [ Fused decode in
    Compose ]); the rest runs as written. The result has the same size, dtype and layout, and
    pixels within the decoder's rounding (docs/vision.md).

    ``fuse=False``, or ``STOKER_VISION_FUSE=0`` in the environment, decodes the whole image
    and runs every transform as written.
    """

    def __init__(self, transforms: Sequence[Any], *, fuse: bool = True) -> None:
        self.transforms = transforms
        self.fuse = fuse

    def fused_plan(self) -> _fused.FusedPlan | None:
        """What the decode replaces for an encoded JPEG (None: nothing; every transform runs
        as written on the full decode)."""
        if not (self.fuse and fusion_allowed()):
            return None
        return _fused.plan_for(self.transforms)

    def __call__(self, img: Any) -> Any:
        if len(self.transforms) and isinstance(self.transforms[0], _IMAGE_TRANSFORMS):
            source = _io.encoded_image(img)
            if source is not None:
                return self._call_encoded(source)
        return self._apply(img, 0)

    def _call_encoded(self, source: _io.Encoded) -> Any:
        plan = self.fused_plan()
        if plan is None:
            return self._apply(_io.decode(source), 0)
        if not isinstance(source, (str, os.PathLike)):
            fused = _fused.run(plan, source)
            if fused is not None:
                return self._apply(*fused)
            return self._apply(_io.decode(source), 0)
        with open(source, "rb") as f:
            fused = _fused.run(plan, f.read())
            if fused is not None:
                return self._apply(*fused)
            f.seek(0)  # the file object, as pil_loader opens it: torchvision's errors
            decoded = _io.pil_image_module().open(f).convert("RGB")
        return self._apply(decoded, 0)

    def _apply(self, img: Any, start: int) -> Any:
        transforms = self.transforms
        for i in range(start, len(transforms)):
            img = transforms[i](img)
        return img

    def __repr__(self) -> str:
        format_string = self.__class__.__name__ + "("
        for t in self.transforms:
            format_string += "\n"
            format_string += f"    {t}"
        format_string += "\n)"
        return format_string
