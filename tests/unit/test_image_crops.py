"""random_resized_crop_box draws torchvision's RandomResizedCrop boxes.

torchvision does not install here (no CPU build), so ``_torchvision_get_params`` below is its
documented algorithm (``RandomResizedCrop.get_params``, torchvision/transforms/transforms.py),
drawing from torch's generator as torchvision does. The two samplers use different generators,
so the test is statistical: a two-sample chi-square test of homogeneity over the exact boxes'
(crop_h, crop_w) and over where they sit, and a two-sample Kolmogorov-Smirnov test on crop area
and log aspect ratio. The same tests must reject two plausible mistakes, so they can fail.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.image import random_resized_crop_box

Box = tuple[int, int, int, int]
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
DRAWS = 12_000


def _torchvision_get_params(gen: torch.Generator, height: int, width: int) -> Box:
    area = height * width
    log_ratio = torch.log(torch.tensor(RATIO))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(SCALE[0], SCALE[1], generator=gen).item()
        aspect_ratio = torch.exp(
            torch.empty(1).uniform_(log_ratio[0].item(), log_ratio[1].item(), generator=gen)
        ).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=gen).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=gen).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(RATIO):
        w = width
        h = int(round(w / min(RATIO)))
    elif in_ratio > max(RATIO):
        h = height
        w = int(round(h * max(RATIO)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _reference(height: int, width: int, seed: int) -> list[Box]:
    gen = torch.Generator().manual_seed(seed)
    return [_torchvision_get_params(gen, height, width) for _ in range(DRAWS)]


def _ours(height: int, width: int, seed: int, draw: Callable[..., Box] = random_resized_crop_box):
    rng = np.random.default_rng(seed)
    return [draw(rng, height, width) for _ in range(DRAWS)]


def _chi_square_p(a: list, b: list) -> float:
    """Two-sample chi-square homogeneity p-value; rare categories pooled (expected < 5)."""
    ca, cb = Counter(a), Counter(b)
    total_a, total_b = len(a), len(b)
    rows, pooled = [], [0, 0]
    for key in set(ca) | set(cb):
        pair = [ca.get(key, 0), cb.get(key, 0)]
        if sum(pair) * min(total_a, total_b) / (total_a + total_b) < 5:
            pooled[0] += pair[0]
            pooled[1] += pair[1]
        else:
            rows.append(pair)
    if sum(pooled) > 0:
        rows.append(pooled)
    stat = 0.0
    for na, nb in rows:
        n = na + nb
        for observed, total in ((na, total_a), (nb, total_b)):
            expected = n * total / (total_a + total_b)
            stat += (observed - expected) ** 2 / expected
    dof = len(rows) - 1
    if dof <= 0:
        return 1.0
    # Wilson-Hilferty: (X/k)^(1/3) is close to normal; accurate enough at these dof.
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ks_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov p-value (asymptotic; conservative on ties)."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    d = np.max(np.abs(np.searchsorted(a, grid, "right") / len(a)
                      - np.searchsorted(b, grid, "right") / len(b)))
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(max(p, 0.0), 1.0)


def _p_values(height: int, width: int, boxes: list[Box], ref: list[Box]) -> dict[str, float]:
    def area(bs):
        return np.array([h * w for _, _, h, w in bs], dtype=float)

    def log_aspect(bs):
        return np.array([math.log(w / h) for _, _, h, w in bs])

    def place(bs):  # where the box sits, in tenths of the free range
        return [(10 * t // (height - h + 1), 10 * left // (width - w + 1)) for t, left, h, w in bs]

    return {
        "sides": _chi_square_p([b[2:] for b in boxes], [b[2:] for b in ref]),
        "place": _chi_square_p(place(boxes), place(ref)),
        "area": _ks_p(area(boxes), area(ref)),
        "aspect": _ks_p(log_aspect(boxes), log_aspect(ref)),
    }


# A 500x375 photo, a small image (few distinct boxes: the chi-square sees every one), and a
# strip where most tries fail and the center fallback decides.
SIZES = [(375, 500), (18, 24), (6, 90)]


@pytest.mark.parametrize("height,width", SIZES)
def test_same_distribution_as_torchvision(height: int, width: int) -> None:
    p = _p_values(height, width, _ours(height, width, seed=1), _reference(height, width, seed=2))
    assert min(p.values()) > 1e-3, p


def _uniform_aspect(rng, height, width):  # mistake 1: aspect uniform, not log-uniform
    area = height * width
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = rng.uniform(*RATIO)
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return 0, 0, height, width


def _whole_image_fallback(rng, height, width):  # mistake 2: fallback to the whole image
    top, left, h, w = random_resized_crop_box(rng, height, width)
    in_ratio = width / height
    is_fallback = (in_ratio < RATIO[0] and w == width and h == round(width / RATIO[0])) or (
        in_ratio > RATIO[1] and h == height and w == round(height * RATIO[1])
    )
    return (0, 0, height, width) if is_fallback else (top, left, h, w)


@pytest.mark.parametrize(
    "mistake,height,width", [(_uniform_aspect, 375, 500), (_whole_image_fallback, 6, 90)]
)
def test_the_statistical_test_rejects_a_wrong_sampler(mistake, height, width) -> None:
    boxes = _ours(height, width, seed=1, draw=mistake)
    p = _p_values(height, width, boxes, _reference(height, width, seed=2))
    assert min(p.values()) < 1e-6, p


def test_same_seed_same_boxes_and_the_stream_advances() -> None:
    first = _ours(375, 500, seed=7)[:50]
    assert first == _ours(375, 500, seed=7)[:50]
    assert len(set(first)) > 40  # successive draws differ


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(1, 2000),
    width=st.integers(1, 2000),
    seed=st.integers(0, 2**32 - 1),
    low=st.floats(0.01, 1.0),
    spread=st.floats(1.0, 4.0),
)
def test_box_lies_inside_the_image(height, width, seed, low, spread) -> None:
    rng = np.random.default_rng(seed)
    top, left, h, w = random_resized_crop_box(
        rng, height, width, scale=(low, 1.0), ratio=(1 / spread, spread)
    )
    assert 1 <= h and 1 <= w
    assert 0 <= top and top + h <= height
    assert 0 <= left and left + w <= width


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"height": 0, "width": 5},
            "random_resized_crop_box: the image is 0 x 5 (height x width); both sides must be "
            "at least 1 pixel",
        ),
        (
            {"height": 5, "width": 5, "scale": (1.0, 0.08)},
            "random_resized_crop_box: scale=(1.0, 0.08) must be (min, max) with 0 < min <= max, "
            "e.g. (0.08, 1.0)",
        ),
        (
            {"height": 5, "width": 5, "ratio": (0.0, 1.0)},
            "random_resized_crop_box: ratio=(0.0, 1.0) must be (min, max) with 0 < min <= max, "
            "e.g. (3/4, 4/3)",
        ),
    ],
)
def test_bad_arguments_say_what_to_change(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        random_resized_crop_box(np.random.default_rng(0), **kwargs)
    assert str(info.value) == message


def test_batch_boxes_fit_follow_the_same_distribution_and_fall_back() -> None:
    from stoker.image.crops import random_resized_crop_boxes

    sizes = [(375, 500), (500, 375), (64, 64), (1, 100)] * 2500
    boxes = np.array(random_resized_crop_boxes(np.random.default_rng(5), sizes))
    dims = np.array(sizes)
    top, left, h, w = boxes.T
    assert (h >= 1).all() and (w >= 1).all()
    assert (top + h <= dims[:, 0]).all() and (left + w <= dims[:, 1]).all()
    # No box of a 1 x 100 image fits the ratio range in 10 tries: torchvision's center crop.
    assert (boxes[3::4] == (0, 49, 1, 1)).all()
    assert random_resized_crop_boxes(np.random.default_rng(5), sizes[:8]) == (
        random_resized_crop_boxes(np.random.default_rng(5), sizes[:8]))  # the seed decides
    one = np.random.default_rng(6)
    single = np.array([random_resized_crop_box(one, *size) for size in sizes[:4] * 2500])
    for k in range(3):  # per image size: the same mean box, within sampling error
        a, b = boxes[k::4].astype(float), single[k::4].astype(float)
        assert np.all(np.abs(a.mean(0) - b.mean(0)) < 4 * np.sqrt(
            (a.var(0) + b.var(0)) / len(a)) + 1e-9)
    assert random_resized_crop_boxes(np.random.default_rng(0), []) == []
    with pytest.raises(ValueError, match="0 x 5"):
        random_resized_crop_boxes(np.random.default_rng(0), [(0, 5)])
