"""Compose given an encoded image: decoded first (Pillow, RGB, as torchvision's
default_loader), and for a JPEG fused with a leading RandomResizedCrop or Resize [+ CenterCrop]
(NOTE [ Fused decode in Compose ]). Against the same list run as written on the full decode
(``fuse=False``): the same random draws and RNG state after every sample, the same shapes,
dtypes and strides, pixels equal when the decode is at full scale and within the bound
docs/vision.md states when it is at reduced scale; when the list goes on to a tensor conversion
(NOTE [ The fused decode's tensor ending ]) the resize is torch's, within ``RESIZE_BOUND`` of
Pillow's at full scale. Run with simplejpeg and with Pillow only."""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
import torch

Image = pytest.importorskip("PIL.Image")
ImageDraw = pytest.importorskip("PIL.ImageDraw")

from stoker.vision import transforms as T  # noqa: E402
from stoker.vision.transforms import _fused  # noqa: E402

# The bound docs/vision.md states for a decode at reduced scale, per image, in levels of 255.
MEAN_BOUND, MAX_BOUND = 4.5, 80
# torch's antialiased uint8 resize against Pillow's, at full scale (docs/vision.md).
RESIZE_BOUND = 1

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def photo_like(height: int, width: int, seed: int, quality: int = 90, mode: str = "RGB") -> bytes:
    """A JPEG with what photos have: smooth shading, hard-edged shapes, sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / 37 + seed), 128 + 90 * np.cos(y / 23),
                     128 + 80 * np.sin((x + y) / 51)], -1)
    img = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(25):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(5, width // 3)), y0 + int(rng.integers(5, height // 3))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=color)
    noisy = np.asarray(img).astype(np.float32) + rng.normal(0, 3, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).convert(mode).save(
        out, "JPEG", quality=quality)
    return out.getvalue()


@pytest.fixture(params=["simplejpeg", "pillow_only"])
def decoder(request, monkeypatch):
    if request.param == "pillow_only":
        monkeypatch.setattr(_fused, "_simplejpeg", None)
    elif _fused._simplejpeg is None:
        pytest.skip("simplejpeg (the fastimage extra) is not installed")
    return request.param


def train_list():
    return [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(MEAN, STD)]


def eval_list():
    return [T.Resize(256), T.CenterCrop(224), T.PILToTensor()]


def _by_hand(img):
    """A conversion the fused path does not know: the image stays a PIL image until here."""
    return T.PILToTensor()(img)


def pil_list():
    return [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), _by_hand]


def _both(transforms, source, seed):
    """(fused output, as-written output), each from ``seed``; the RNG states after must match."""
    torch.manual_seed(seed)
    fused = T.Compose(transforms)(source)
    after_fused = torch.get_rng_state()
    torch.manual_seed(seed)
    plain = T.Compose(transforms, fuse=False)(source)
    assert torch.equal(after_fused, torch.get_rng_state()), "the RNG moved differently"
    assert fused.shape == plain.shape and fused.dtype == plain.dtype
    assert fused.stride() == plain.stride() and fused.is_contiguous() == plain.is_contiguous()
    return fused, plain


def _levels(tensor: torch.Tensor) -> torch.Tensor:
    """Back to 0..255 levels (undoing Normalize / ToTensor) for the pixel comparison."""
    if tensor.dtype == torch.uint8:
        return tensor.int()
    return ((tensor * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1))
            * 255).round().int()


def _full_scale(jpeg: bytes, seed: int, transforms) -> bool:
    """Whether the fused path decodes this sample at full scale (and so must be exact)."""
    height, width = _fused.jpeg_size(jpeg)
    torch.manual_seed(seed)
    first = transforms[0]
    if isinstance(first, T.RandomResizedCrop):
        _, _, h, w = first.get_params(Image.new("RGB", (width, height)), first.scale, first.ratio)
        need = max(224 / h, 224 / w)
    else:
        new_h, new_w = first.output_size(height, width)
        need = max(new_h / height, new_w / width)
    return need > 0.5  # 1/2 is the largest reduced scale either decoder uses


@pytest.mark.parametrize("make", [train_list, eval_list, pil_list],
                         ids=["train", "eval", "pil"])
@pytest.mark.parametrize("size", [(375, 500), (333, 500), (160, 200), (1200, 900)])
def test_fused_matches_as_written(decoder, make, size) -> None:
    exact = reduced = 0
    tensor_ending = T.Compose(make()).fused_plan().ending is not None
    assert tensor_ending == (make is not pil_list)
    for seed in range(6):
        jpeg = photo_like(*size, seed=seed)
        fused, plain = _both(make(), jpeg, seed)
        diff = (_levels(fused) - _levels(plain)).abs()
        if _full_scale(jpeg, seed, make()):
            if tensor_ending:
                assert diff.max() <= RESIZE_BOUND, (seed, "torch's resize is Pillow's")
            else:
                assert torch.equal(fused, plain), (seed, "a full-scale decode must be exact")
            exact += 1
        else:
            assert diff.float().mean() <= MEAN_BOUND and diff.max() <= MAX_BOUND, (
                seed, float(diff.float().mean()), int(diff.max()))
            reduced += 1
    assert exact + reduced == 6


def test_a_real_photo_is_within_the_bound(decoder) -> None:
    cbook = pytest.importorskip("matplotlib.cbook")
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        jpeg = f.read()
    for make, seeds in ((train_list, range(12)), (eval_list, range(1))):
        for seed in seeds:
            fused, plain = _both(make(), jpeg, seed)
            diff = (_levels(fused) - _levels(plain)).abs()
            assert diff.float().mean() <= MEAN_BOUND and diff.max() <= MAX_BOUND, seed


def test_every_encoded_input_kind(tmp_path: pathlib.Path) -> None:
    jpeg = photo_like(180, 240, seed=1)
    path = tmp_path / "a.jpg"
    path.write_bytes(jpeg)
    transforms = train_list()
    torch.manual_seed(0)
    expected = T.Compose(transforms)(jpeg)
    for source in (str(path), path, bytearray(jpeg), memoryview(jpeg),
                   {"bytes": jpeg, "path": None}, {"bytes": None, "path": str(path)}):
        torch.manual_seed(0)
        assert torch.equal(T.Compose(transforms)(source), expected), type(source)
    with pytest.raises(ValueError, match=r"holds no image: a datasets Image column needs"):
        T.Compose(transforms)({"bytes": None, "path": None})


def test_decoded_images_and_tensors_run_as_written() -> None:
    img = Image.open(io.BytesIO(photo_like(100, 120, seed=2))).convert("RGB")
    torch.manual_seed(1)
    out = T.Compose(eval_list())(img)
    torch.manual_seed(1)
    expected = T.PILToTensor()(T.CenterCrop(224)(T.Resize(256)(img)))
    assert torch.equal(out, expected)
    tensor = torch.zeros(3, 10, 10, dtype=torch.uint8)
    assert T.Compose([T.CenterCrop(4)])(tensor).shape == (3, 4, 4)


@pytest.mark.parametrize("kind", ["png", "cmyk", "gray", "progressive"])
def test_other_images(decoder, kind) -> None:
    base = Image.open(io.BytesIO(photo_like(300, 400, seed=3))).convert("RGB")
    out = io.BytesIO()
    if kind == "png":
        base.save(out, "PNG")
    elif kind == "cmyk":
        base.convert("CMYK").save(out, "JPEG")
    elif kind == "gray":
        base.convert("L").save(out, "JPEG")
    else:
        base.save(out, "JPEG", progressive=True)
    data = out.getvalue()
    fusable = kind in ("gray", "progressive")
    assert (_fused.jpeg_size(data) is not None) == fusable
    for seed in range(4):
        fused, plain = _both(train_list(), data, seed)
        if not fusable:
            assert torch.equal(fused, plain), (kind, seed)
        elif _full_scale(data, seed, train_list()):
            assert (_levels(fused) - _levels(plain)).abs().max() <= RESIZE_BOUND, (kind, seed)
        else:
            assert (_levels(fused) - _levels(plain)).abs().float().mean() <= MEAN_BOUND


def test_a_broken_jpeg_fails_as_written_with_the_same_draws(decoder) -> None:
    truncated = photo_like(300, 400, seed=4)[:3000]
    errors = []
    for fuse in (True, False):
        torch.manual_seed(5)
        with pytest.raises(OSError) as info:
            T.Compose(train_list(), fuse=fuse)(truncated)
        errors.append((type(info.value), str(info.value), torch.get_rng_state()))
    assert errors[0][:2] == errors[1][:2]  # Pillow's own error, both ways
    assert torch.equal(errors[0][2], errors[1][2])


def test_what_is_fused() -> None:
    transforms = train_list()
    plan = T.Compose(transforms).fused_plan()
    assert plan.crop is transforms[0] and plan.resize is None and plan.consumed == 1
    assert plan.ending.flips == (transforms[1],) and plan.ending.convert is transforms[2]
    assert plan.ending.normalize is transforms[3] and plan.ending.end == 4
    plan = T.Compose(eval_list()).fused_plan()
    assert plan is not None and plan.center is not None and plan.consumed == 2
    assert plan.ending.flips == () and plan.ending.end == 3
    assert T.Compose([T.Resize(64), T.ToTensor()]).fused_plan().consumed == 1
    no_ending = [
        pil_list(),
        [T.RandomResizedCrop(224), T.Normalize(MEAN, STD)],  # no conversion
        [T.RandomResizedCrop(224), type("MyFlip", (T.RandomHorizontalFlip,), {})(),
         T.ToTensor()],  # a subclass may draw its own way
        [T.RandomResizedCrop(224)],
    ]
    for transforms in no_ending:
        plan = T.Compose(transforms).fused_plan()
        assert plan is not None and plan.ending is None, transforms
    unfused = [
        [T.RandomHorizontalFlip(), T.RandomResizedCrop(224)],  # the flip draws first
        [T.RandomResizedCrop(224, interpolation=T.InterpolationMode.NEAREST)],
        [T.RandomResizedCrop(224, antialias=False)],
        [T.CenterCrop(224), T.ToTensor()],
        [type("MyCrop", (T.RandomResizedCrop,), {})(224)],  # a subclass may draw its own way
        [],
    ]
    for transforms in unfused:
        assert T.Compose(transforms).fused_plan() is None, transforms
    assert T.Compose(train_list(), fuse=False).fused_plan() is None


def test_the_environment_turns_fusion_off(monkeypatch) -> None:
    monkeypatch.setenv(T.FUSE_ENV, "0")
    assert T.Compose(train_list()).fused_plan() is None
    monkeypatch.setenv(T.FUSE_ENV, "1")
    assert T.Compose(train_list()).fused_plan() is not None


def test_a_list_not_starting_with_an_image_transform_gets_the_input_as_is() -> None:
    # torchvision's Compose passes anything through; so does this one unless its first
    # transform needs an image.
    assert T.Compose([str.upper, len])("not a path") == 10
    assert T.Compose([bytes.hex])(b"\x01") == "01"


def test_a_padded_center_crop_runs_as_written(decoder) -> None:
    jpeg = photo_like(60, 80, seed=6)
    transforms = [T.Resize(32), T.CenterCrop(48), T.PILToTensor()]
    fused, plain = _both(transforms, jpeg, 0)
    assert torch.equal(fused, plain) and fused.shape == (3, 48, 48)


def test_a_reduced_scale_crop_starts_where_its_box_does() -> None:
    from stoker.vision.transforms import _fused_tensor as FT

    rng = np.random.default_rng(0)
    for _ in range(300):
        height, width = int(rng.integers(300, 2000)), int(rng.integers(300, 2000))
        h, w = int(rng.integers(230, height + 1)), int(rng.integers(230, width + 1))
        box = (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
        m = FT.decode_scale(box, (height, width), (224, 224))
        assert 1 <= m <= 8 and h * m / 8 >= 224 and w * m / 8 >= 224
        if m == 8:
            continue
        f, decoded = m / 8, (-(-height * m // 8), -(-width * m // 8))
        miss, (y0, x0, y1, x1), (ky, kx) = FT.scaled_region(box, f, (224, 224), *decoded)
        assert miss <= FT.MISS
        step_y, step_x = h * f / 224, w * f / 224
        assert abs(y0 + ky * step_y - box[0] * f) <= FT.MISS  # the first kept output pixel
        assert abs(x0 + kx * step_x - box[1] * f) <= FT.MISS
        assert (ky >= FT._MARGIN or y0 == 0) and (kx >= FT._MARGIN or x0 == 0)
        assert y1 >= min(decoded[0], (box[0] + h) * f) and x1 >= min(decoded[1], (box[1] + w) * f)


@pytest.mark.parametrize("inplace", [False, True])
def test_the_tensor_ending_converts_as_written(inplace) -> None:
    from stoker.vision.transforms import _fused_tensor as FT

    pixels = np.random.default_rng(1).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    chw = torch.from_numpy(pixels).permute(2, 0, 1)  # HWC memory, as the resize leaves it
    lists = [
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(p=1.0), T.ToTensor(),
         T.Normalize(MEAN, STD, inplace=inplace), T.ConvertImageDtype(torch.float64)],
        [T.RandomResizedCrop(8), T.ToTensor()],
        [T.RandomResizedCrop(8), T.RandomHorizontalFlip(p=0.0), T.PILToTensor()],
    ]
    for transforms in lists:
        ending = FT.ending_for(transforms, 1)
        ours = FT.finish(chw, ending)
        for t in transforms[ending.end:]:
            ours = t(ours)
        theirs = Image.fromarray(pixels)
        for t in transforms[1:]:
            theirs = t(theirs)
        assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype  # bit for bit
        assert ours.stride() == theirs.stride(), transforms
    with pytest.raises(ValueError, match="std evaluated to zero"):
        FT.finish(chw, FT.ending_for([T.Resize(8), T.ToTensor(), T.Normalize(MEAN, (1, 0, 1))],
                                     1))
