"""stoker.vision against torchvision's own objects, where torchvision can be imported (its
wheels need a matching torch build: on the GPU machine; skipped here beside the CPU torch).
The same boxes, flips and RNG state for the same seed, the same pixels, dtypes and strides on
PIL images and tensors, the same signatures, defaults and reprs, the same folder samples and
errors; the fused decode within docs/vision.md's bound of torchvision's decode-then-crop."""

from __future__ import annotations

import inspect
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch

tv_transforms = pytest.importorskip("torchvision.transforms")
tv_datasets = pytest.importorskip("torchvision.datasets")
Image = pytest.importorskip("PIL.Image")

from stoker.vision import datasets  # noqa: E402
from stoker.vision import transforms as T  # noqa: E402

MEAN_BOUND, MAX_BOUND = 4.5, 80  # as tests/unit/test_vision_compose.py and docs/vision.md
NAMES = ["Compose", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
         "ToTensor", "PILToTensor", "Normalize", "ConvertImageDtype"]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _photo(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / 37 + seed), 128 + 90 * np.cos(y / 23),
                     128 + 80 * np.sin((x + y) / 51)], -1) + rng.normal(0, 6, (height, width, 3))
    return Image.fromarray(base.clip(0, 255).astype(np.uint8))


def _pipelines(tv, ours):
    return [
        [tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(),
         tv.Normalize(MEAN, STD)],
        [tv.Resize(256), tv.CenterCrop(224), tv.PILToTensor(),
         tv.ConvertImageDtype(torch.float32)],
        [tv.RandomResizedCrop((100, 150), scale=(0.3, 0.9), ratio=(0.5, 2.0),
                              interpolation=tv.InterpolationMode.BICUBIC), tv.PILToTensor()],
        [tv.Resize(100, max_size=120), tv.CenterCrop(130), tv.ToTensor()],
    ]


def _run(transforms, img, seed):
    torch.manual_seed(seed)
    return transforms(img), torch.get_rng_state()


def test_the_same_names_exist() -> None:
    for name in NAMES + ["InterpolationMode"]:
        assert hasattr(tv_transforms, name) and hasattr(T, name), name


def test_signatures_defaults_and_reprs() -> None:
    for name in NAMES:
        theirs = inspect.signature(getattr(tv_transforms, name)).parameters
        ours = inspect.signature(getattr(T, name)).parameters
        for param, spec in theirs.items():
            assert param in ours, (name, param)
            default = spec.default
            if isinstance(default, tv_transforms.InterpolationMode):
                assert ours[param].default.value == default.value, (name, param)
            else:
                assert ours[param].default == default, (name, param)
    for tv_t, our_t in zip(_pipelines(tv_transforms, T)[0], _pipelines(T, T)[0], strict=True):
        assert repr(tv_t) == repr(our_t)


@pytest.mark.parametrize("size", [(375, 500), (500, 333), (64, 64), (7, 900)])
def test_boxes_flips_and_rng_state(size) -> None:
    img = _photo(*size, seed=0)
    for seed in range(50):
        theirs = _run(lambda im: (tv_transforms.RandomResizedCrop.get_params(
            im, (0.08, 1.0), (3 / 4, 4 / 3)), bool(torch.rand(1) < 0.5)), img, seed)
        ours = _run(lambda im: (T.RandomResizedCrop.get_params(
            im, (0.08, 1.0), (3 / 4, 4 / 3)), bool(torch.rand(1) < 0.5)), img, seed)
        assert theirs[0] == ours[0] and torch.equal(theirs[1], ours[1]), seed


@pytest.mark.parametrize("index", range(4))
def test_pipelines_on_pil_images_and_tensors(index) -> None:
    tv_list, our_list = _pipelines(tv_transforms, T)[index], _pipelines(T, T)[index]
    for seed, size in enumerate([(375, 500), (500, 333), (90, 120)]):
        img = _photo(*size, seed=seed)
        theirs, tv_state = _run(tv_transforms.Compose(tv_list), img, seed)
        ours, our_state = _run(T.Compose(our_list, fuse=False), img, seed)
        assert torch.equal(tv_state, our_state)
        assert theirs.dtype == ours.dtype and theirs.stride() == ours.stride()
        assert torch.equal(theirs, ours), (index, seed)
        tensor = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        geometric = [t for t in tv_list[:2] if not isinstance(t, tv_transforms.ToTensor)
                     and not isinstance(t, tv_transforms.PILToTensor)]
        our_geometric = our_list[:len(geometric)]
        theirs, tv_state = _run(tv_transforms.Compose(geometric), tensor, seed)
        ours, our_state = _run(T.Compose(our_geometric), tensor, seed)
        assert torch.equal(tv_state, our_state) and torch.equal(theirs, ours), (index, seed)


def test_fused_decode_against_torchvision(tmp_path: Path) -> None:
    for seed, size in enumerate([(375, 500), (1000, 750), (120, 160)]):
        path = tmp_path / f"{seed}.jpg"
        _photo(*size, seed=seed).save(path, "JPEG", quality=90)
        for tv_list, our_list in zip(_pipelines(tv_transforms, T), _pipelines(T, T), strict=True):
            theirs, tv_state = _run(tv_transforms.Compose(tv_list),
                                    tv_datasets.folder.default_loader(str(path)), seed)
            ours, our_state = _run(T.Compose(our_list), str(path), seed)
            assert torch.equal(tv_state, our_state) and theirs.shape == ours.shape
            scale = 255.0 if theirs.is_floating_point() else 1.0
            diff = ((theirs.double() - ours.double()) * scale).abs()
            if any(isinstance(t, T.Normalize) for t in our_list):
                diff = diff * torch.tensor(STD, dtype=torch.double).view(3, 1, 1)
            assert diff.mean() <= MEAN_BOUND and diff.max() <= MAX_BOUND + 1, (seed, size)


def test_folders(tmp_path: Path) -> None:
    for name in ("b/2.JPG", "b/1.png", "a/x/3.jpeg", "a/0.jpg", "c/notes.txt"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        Image.new("RGB", (8, 6)).save(out, "PNG" if name.endswith("png") else "JPEG")
        path.write_bytes(out.getvalue())
    with pytest.raises(FileNotFoundError) as theirs:
        tv_datasets.ImageFolder(str(tmp_path))
    with pytest.raises(FileNotFoundError) as ours:
        datasets.ImageFolder(str(tmp_path))
    assert str(theirs.value) == str(ours.value)
    os.remove(tmp_path / "c/notes.txt")
    os.rmdir(tmp_path / "c")
    tv_folder, our_folder = tv_datasets.ImageFolder(str(tmp_path)), datasets.ImageFolder(
        str(tmp_path))
    for attr in ("classes", "class_to_idx", "samples", "targets", "imgs", "extensions"):
        assert getattr(tv_folder, attr) == getattr(our_folder, attr), attr
    assert np.array_equal(np.asarray(tv_folder[1][0]), np.asarray(our_folder[1][0]))
    assert tv_datasets.folder.IMG_EXTENSIONS == datasets.IMG_EXTENSIONS


def test_torchvisions_own_pipeline_is_recognised_for_the_import_advice(tmp_path: Path) -> None:
    from stoker.vision.import_gain import fused_equivalent, measure

    for index, tv_list in enumerate(_pipelines(tv_transforms, T)):
        ours = fused_equivalent(tv_transforms.Compose(tv_list))
        assert ours is not None and ours.fused_plan() is not None, index
        assert [repr(t) for t in ours.transforms] == [repr(t) for t in tv_list], index
    (tmp_path / "a").mkdir()
    for i in range(3):
        _photo(300, 400, seed=i).save(tmp_path / "a" / f"{i}.jpg", "JPEG", quality=90)
    folder = tv_datasets.ImageFolder(str(tmp_path), tv_transforms.Compose(
        _pipelines(tv_transforms, T)[0]))
    gain = measure(folder, budget_s=0.0)
    assert gain is not None and gain.images == 3 and gain.fused_ms > 0
