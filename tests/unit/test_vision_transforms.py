"""stoker.vision.transforms, one class at a time, against torchvision's documented algorithms
(torchvision itself cannot be imported beside the CPU torch here; test_vision_torchvision.py
compares with its objects where it can): the same random draws from torch's generator, in the
same order and number, the same sizes, offsets, pixels (Pillow's own resize on PIL images),
dtypes and layouts, and the same signatures and defaults."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

Image = pytest.importorskip("PIL.Image")

from stoker.vision import transforms as T  # noqa: E402
from stoker.vision.transforms import InterpolationMode  # noqa: E402


def _image(height: int, width: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


def _reference_box(height: int, width: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params, step by step from its documentation."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize("size", [(375, 500), (500, 333), (64, 64), (7, 900), (900, 7)])
@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.9), (1.0, 2.0)),
                                         ((0.9, 1.0), (3.0, 4.0))])
def test_crop_boxes_and_rng_use_are_torchvisions(size, scale, ratio) -> None:
    height, width = size
    img = _image(height, width)
    for seed in range(40):
        torch.manual_seed(seed)
        ours = T.RandomResizedCrop.get_params(img, scale, ratio)
        after = torch.get_rng_state()
        torch.manual_seed(seed)
        assert ours == _reference_box(height, width, scale, ratio), (seed, size)
        assert torch.equal(after, torch.get_rng_state()), "a different number of draws"


def test_fallback_is_the_ratio_clamped_center_crop() -> None:
    # A 7 x 900 image fits no box of ratio 3/4..4/3 and area >= 8 %: the fallback, every time.
    torch.manual_seed(0)
    assert T.RandomResizedCrop.get_params(_image(7, 900), (0.08, 1.0), (3 / 4, 4 / 3)) == (
        0, (900 - 9) // 2, 7, 9)


def test_random_resized_crop_is_crop_then_pillow_resize() -> None:
    img = _image(120, 160, seed=1)
    crop = T.RandomResizedCrop(48)
    for seed in range(10):
        torch.manual_seed(seed)
        top, left, h, w = _reference_box(120, 160)
        expected = img.crop((left, top, left + w, top + h)).resize((48, 48), Image.BILINEAR)
        torch.manual_seed(seed)
        out = crop(img)
        assert out.size == (48, 48) and out.mode == "RGB"
        assert np.array_equal(np.asarray(out), np.asarray(expected)), seed


def test_random_resized_crop_on_a_tensor_interpolates_the_crop_with_antialias() -> None:
    img = torch.from_numpy(np.asarray(_image(90, 70, seed=2)).copy()).permute(2, 0, 1)
    torch.manual_seed(3)
    top, left, h, w = _reference_box(90, 70)
    region = img[..., top:top + h, left:left + w].unsqueeze(0).float()
    expected = torch.nn.functional.interpolate(
        region, size=[30, 40], mode="bilinear", align_corners=False, antialias=True
    ).round().to(torch.uint8)[0]
    torch.manual_seed(3)
    out = T.RandomResizedCrop((30, 40))(img)
    assert out.dtype == torch.uint8 and torch.equal(out, expected)


def test_horizontal_flip_draws_one_rand_and_compares_it_to_p() -> None:
    img = _image(5, 6)
    mirrored = np.asarray(img)[:, ::-1]
    for seed in range(20):
        torch.manual_seed(seed)
        flipped = bool(torch.rand(1) < 0.5)
        after = torch.get_rng_state()
        torch.manual_seed(seed)
        out = np.asarray(T.RandomHorizontalFlip()(img))
        assert torch.equal(after, torch.get_rng_state())
        assert np.array_equal(out, mirrored if flipped else np.asarray(img))
    tensor = torch.arange(6).view(1, 2, 3)
    assert torch.equal(T.RandomHorizontalFlip(p=1.0)(tensor), tensor.flip(-1))
    assert T.RandomHorizontalFlip(p=0.0)(tensor) is tensor


@pytest.mark.parametrize("hw,size,max_size,expected", [
    ((375, 500), 256, None, (256, 341)),     # int(256 * 500 / 375) = 341
    ((500, 375), 256, None, (341, 256)),
    ((100, 100), 32, None, (32, 32)),
    ((375, 500), [256], None, (256, 341)),
    ((375, 500), (100, 120), None, (100, 120)),
    ((100, 400), 64, 200, (50, 200)),       # capped: int(200 * 64 / 256) = 50
    ((100, 400), 64, 300, (64, 256)),       # under the cap
])
def test_resize_sizes(hw, size, max_size, expected) -> None:
    img = _image(*hw)
    out = T.Resize(size, max_size=max_size)(img)
    assert (out.height, out.width) == expected
    assert np.array_equal(np.asarray(out),
                          np.asarray(img.resize(expected[::-1], Image.BILINEAR)))


def test_resize_to_the_same_size_returns_the_image_itself() -> None:
    img = _image(32, 48)
    assert T.Resize(32)(img) is img


def test_resize_errors_are_torchvisions() -> None:
    with pytest.raises(ValueError, match=r"max_size = 64 must be strictly greater than the "
                       r"requested size for the smaller edge size = \[64\]"):
        T.Resize(64, max_size=64)(_image(10, 20))
    with pytest.raises(ValueError, match="max_size should only be passed if size specifies"):
        T.Resize((10, 20), max_size=64)(_image(10, 20))
    with pytest.raises(ValueError, match="If size is a sequence, it should have 1 or 2 values"):
        T.Resize((1, 2, 3))
    with pytest.raises(TypeError, match="Size should be int or sequence"):
        T.Resize(2.5)  # type: ignore[arg-type]


def test_resize_tensor_uses_interpolate_with_antialias_and_rounds_uint8() -> None:
    img = torch.from_numpy(np.asarray(_image(40, 60, seed=4)).copy()).permute(2, 0, 1)
    expected = torch.nn.functional.interpolate(
        img.unsqueeze(0).float(), size=[20, 30], mode="bilinear", align_corners=False,
        antialias=True).round().to(torch.uint8)[0]
    assert torch.equal(T.Resize(20)(img), expected)


@pytest.mark.parametrize("hw,crop,top_left", [
    ((10, 10), 5, (2, 2)),    # round(2.5) = 2 (half to even), as Python's round
    ((12, 12), 5, (4, 4)),    # round(3.5) = 4
    ((11, 20), (4, 7), (4, 6)),
])
def test_center_crop_offsets(hw, crop, top_left) -> None:
    img = _image(*hw)
    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    top, left = top_left
    out = T.CenterCrop(crop)(img)
    assert np.array_equal(np.asarray(out), np.asarray(img)[top:top + ch, left:left + cw])
    tensor = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
    assert torch.equal(T.CenterCrop(crop)(tensor), tensor[:, top:top + ch, left:left + cw])


def test_center_crop_larger_than_the_image_pads_with_zeros() -> None:
    img = _image(3, 4, seed=5)
    out = np.asarray(T.CenterCrop((6, 7))(img))
    expected = np.zeros((6, 7, 3), np.uint8)
    expected[1:4, 1:5] = np.asarray(img)  # left (7-4)//2 = 1, top (6-3)//2 = 1
    assert np.array_equal(out, expected)
    tensor = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
    assert torch.equal(T.CenterCrop((6, 7))(tensor),
                       torch.from_numpy(expected).permute(2, 0, 1))


def test_to_tensor_scales_uint8_to_the_default_float_dtype() -> None:
    img = _image(4, 5, seed=6)
    out = T.ToTensor()(img)
    assert out.shape == (3, 4, 5) and out.dtype == torch.float32 and out.is_contiguous()
    assert torch.equal(out, torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255)
    assert T.ToTensor()(_image(4, 5, mode="L")).shape == (1, 4, 5)
    assert torch.equal(T.ToTensor()(np.array(img)), out)
    floats = np.ones((2, 3, 1), np.float64)
    assert T.ToTensor()(floats).dtype == torch.float64  # not uint8: unscaled
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert T.ToTensor()(img).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    with pytest.raises(TypeError, match="pic should be PIL Image or ndarray. Got <class 'torch"):
        T.ToTensor()(out)


def test_pil_to_tensor_keeps_dtype_as_a_chw_view() -> None:
    img = _image(4, 5, seed=7)
    out = T.PILToTensor()(img)
    assert out.shape == (3, 4, 5) and out.dtype == torch.uint8
    assert out.stride() == (1, 15, 3)  # a permuted view of the HWC copy, as torchvision's
    assert torch.equal(out, torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1))
    with pytest.raises(TypeError, match="pic should be PIL Image. Got <class 'numpy.ndarray'>"):
        T.PILToTensor()(np.asarray(img))


def test_convert_image_dtype() -> None:
    u8 = torch.tensor([[[0, 128, 255]]], dtype=torch.uint8)
    assert torch.equal(T.ConvertImageDtype(torch.float32)(u8), u8.float() / 255)
    floats = torch.tensor([[[0.0, 0.5, 1.0]]])
    assert T.ConvertImageDtype(torch.uint8)(floats).tolist() == [[[0, 127, 255]]]
    assert T.ConvertImageDtype(torch.int16)(u8).tolist() == [[[0, 128 * 128, 255 * 128]]]
    assert T.ConvertImageDtype(torch.uint8)(torch.tensor([[[32767]]], dtype=torch.int16)
                                            ).tolist() == [[[255]]]
    with pytest.raises(RuntimeError, match="The cast from torch.float32 to torch.int64 cannot"):
        T.ConvertImageDtype(torch.int64)(floats)


def test_normalize() -> None:
    x = torch.rand(3, 4, 5)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    expected = (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    out = T.Normalize(mean, std)(x)
    assert torch.allclose(out, expected) and out is not x
    assert T.Normalize(mean, std, inplace=True)(x) is x
    with pytest.raises(TypeError, match="Input tensor should be a float tensor. Got torch.uint8"):
        T.Normalize(mean, std)(torch.zeros(3, 2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="std evaluated to zero"):
        T.Normalize(mean, (1.0, 0.0, 1.0))(torch.rand(3, 2, 2))


def test_interpolation_modes_accept_pillow_constants() -> None:
    assert T.Resize(8, interpolation=Image.BICUBIC).interpolation is InterpolationMode.BICUBIC
    assert T.RandomResizedCrop(8, interpolation=0).interpolation is InterpolationMode.NEAREST
    with pytest.raises(TypeError, match="interpolation='bilinear': expected an "
                       "InterpolationMode"):
        T.Resize(8, interpolation="bilinear")  # type: ignore[arg-type]


def _defaults(cls) -> dict:
    return {name: p.default for name, p in inspect.signature(cls).parameters.items()}


def test_signatures_and_defaults_are_torchvisions() -> None:
    empty = inspect.Parameter.empty
    bilinear = InterpolationMode.BILINEAR
    assert _defaults(T.RandomResizedCrop) == {
        "size": empty, "scale": (0.08, 1.0), "ratio": (3.0 / 4.0, 4.0 / 3.0),
        "interpolation": bilinear, "antialias": True}
    assert _defaults(T.Resize) == {"size": empty, "interpolation": bilinear, "max_size": None,
                                   "antialias": True}
    assert _defaults(T.CenterCrop) == {"size": empty}
    assert _defaults(T.RandomHorizontalFlip) == {"p": 0.5}
    assert _defaults(T.Normalize) == {"mean": empty, "std": empty, "inplace": False}
    assert _defaults(T.ConvertImageDtype) == {"dtype": empty}
    assert _defaults(T.ToTensor) == {} and _defaults(T.PILToTensor) == {}
    assert _defaults(T.Compose) == {"transforms": empty, "fuse": True}
    for module_class in (T.RandomResizedCrop, T.Resize, T.CenterCrop, T.RandomHorizontalFlip,
                         T.Normalize, T.ConvertImageDtype):
        assert issubclass(module_class, torch.nn.Module)  # as torchvision's are


def test_reprs_are_torchvisions() -> None:
    assert repr(T.RandomResizedCrop(224)) == (
        "RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333), "
        "interpolation=bilinear, antialias=True)")
    assert repr(T.Resize(256)) == (
        "Resize(size=256, interpolation=bilinear, max_size=None, antialias=True)")
    assert repr(T.CenterCrop(224)) == "CenterCrop(size=(224, 224))"
    assert repr(T.Normalize((0.5,), (0.2,))) == "Normalize(mean=(0.5,), std=(0.2,))"
    assert repr(T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])) == (
        "Compose(\n    RandomHorizontalFlip(p=0.5)\n    ToTensor()\n)")
