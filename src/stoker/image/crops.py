"""Random crop boxes drawn from the same distribution as torchvision's ``RandomResizedCrop``.

torchvision's ``RandomResizedCrop.get_params`` (the algorithm of the Inception paper): up to 10
tries of an area uniform in ``scale × image area`` and an aspect ratio log-uniform in ``ratio``;
the first box that fits (after rounding its sides to integers) is placed uniformly at random;
when none fits, a center crop clamped to the ratio range. This module draws the same boxes from
a ``numpy.random.Generator`` instead of torch's global generator, so a caller chooses the stream
(``stoker.sample_rng()`` gives one seeded per sample, identical under any executor).
"""

from __future__ import annotations

import math

import numpy as np

_TRIES = 10


def random_resized_crop_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(top, left, crop_h, crop_w)`` of a random crop of a ``height × width`` image.

    ``scale`` bounds the crop's share of the image area, ``ratio`` its width / height. The box
    always lies inside the image and is at least 1 × 1.
    """
    _check_arguments(height, width, scale, ratio)
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(_TRIES):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        crop_w = int(round(math.sqrt(target_area * aspect)))
        crop_h = int(round(math.sqrt(target_area / aspect)))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            # torch.randint(0, n + 1) and Generator.integers(0, n + 1): both uniform on 0..n.
            top = int(rng.integers(0, height - crop_h + 1))
            left = int(rng.integers(0, width - crop_w + 1))
            return top, left, crop_h, crop_w
    return _center_fallback(height, width, ratio)


def _center_fallback(
    height: int, width: int, ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    in_ratio = width / height
    low, high = min(ratio), max(ratio)
    if in_ratio < low:
        crop_w, crop_h = width, int(round(width / low))
    elif in_ratio > high:
        crop_h, crop_w = height, int(round(height * high))
    else:
        crop_h, crop_w = height, width
    return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w


def _check_arguments(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    if height <= 0 or width <= 0:
        raise ValueError(
            f"random_resized_crop_box: the image is {height} x {width} (height x width); "
            "both sides must be at least 1 pixel"
        )
    if not 0 < scale[0] <= scale[1]:
        raise ValueError(
            f"random_resized_crop_box: scale={tuple(scale)} must be (min, max) with "
            "0 < min <= max, e.g. (0.08, 1.0)"
        )
    if not 0 < ratio[0] <= ratio[1]:
        raise ValueError(
            f"random_resized_crop_box: ratio={tuple(ratio)} must be (min, max) with "
            "0 < min <= max, e.g. (3/4, 4/3)"
        )


def random_resized_crop_boxes(
    rng: np.random.Generator,
    sizes: list[tuple[int, int]],
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> list[tuple[int, int, int, int]]:
    """``random_resized_crop_box`` for a whole batch of ``(height, width)`` at once: the same
    distribution (10 tries each, the first that fits placed uniformly, else the clamped center
    crop), drawn in one vectorised pass (a few numpy calls, not tens per image). The boxes are
    not those of calling ``random_resized_crop_box`` image by image with the same generator:
    the draws are taken in another order."""
    for height, width in sizes:
        _check_arguments(height, width, scale, ratio)
    n = len(sizes)
    if n == 0:
        return []
    dims = np.asarray(sizes, dtype=np.int64).reshape(n, 2)
    heights, widths = dims[:, 0], dims[:, 1]
    target = (heights * widths)[:, None] * rng.uniform(scale[0], scale[1], (n, _TRIES))
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), (n, _TRIES)))
    crop_w = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # round half to even, as round()
    crop_h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (crop_w > 0) & (crop_w <= widths[:, None]) & (crop_h > 0) & (
        crop_h <= heights[:, None])
    first = fits.argmax(axis=1)
    rows = np.arange(n)
    h, w = crop_h[rows, first], crop_w[rows, first]
    top = rng.integers(0, np.maximum(heights - h, 0) + 1)
    left = rng.integers(0, np.maximum(widths - w, 0) + 1)
    boxes = []
    fitted = [bool(v) for v in np.any(fits, axis=1)]
    for k, ok in enumerate(fitted):
        if ok:
            boxes.append((int(top[k]), int(left[k]), int(h[k]), int(w[k])))
        else:
            boxes.append(_center_fallback(int(heights[k]), int(widths[k]), ratio))
    return boxes
