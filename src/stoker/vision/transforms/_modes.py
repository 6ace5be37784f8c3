"""``InterpolationMode``: torchvision's enum of resampling filters, and its Pillow numbers."""

from __future__ import annotations

from enum import Enum


class InterpolationMode(Enum):
    """Interpolation modes, as ``torchvision.transforms.InterpolationMode``: ``nearest``,
    ``nearest-exact``, ``bilinear`` and ``bicubic`` for tensors and PIL images, ``box``,
    ``hamming`` and ``lanczos`` for PIL images only."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    # For PIL compatibility
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


# Pillow's filter numbers (Image.Resampling), as torchvision maps them.
PIL_FILTERS = {
    InterpolationMode.NEAREST: 0,
    InterpolationMode.NEAREST_EXACT: 0,
    InterpolationMode.BILINEAR: 2,
    InterpolationMode.BICUBIC: 3,
    InterpolationMode.BOX: 4,
    InterpolationMode.HAMMING: 5,
    InterpolationMode.LANCZOS: 1,
}
_FROM_PIL = {
    0: InterpolationMode.NEAREST,
    2: InterpolationMode.BILINEAR,
    3: InterpolationMode.BICUBIC,
    4: InterpolationMode.BOX,
    5: InterpolationMode.HAMMING,
    1: InterpolationMode.LANCZOS,
}


def interpolation_mode(value: InterpolationMode | int) -> InterpolationMode:
    """``value`` as an ``InterpolationMode``: Pillow's integer constants are accepted, as
    torchvision accepts them."""
    if isinstance(value, InterpolationMode):
        return value
    if isinstance(value, int) and value in _FROM_PIL:
        return _FROM_PIL[value]
    raise TypeError(
        f"interpolation={value!r}: expected an InterpolationMode (e.g. "
        "InterpolationMode.BILINEAR) or a corresponding Pillow integer constant"
    )
