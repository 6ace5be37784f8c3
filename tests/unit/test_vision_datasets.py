"""stoker.vision.datasets: torchvision's folder datasets (classes, sample order, targets,
errors word for word), the path handed to a fused Compose, and the image sources the issue
names: stoker's TarShards / TarShardStream samples and a Hugging Face datasets Image column."""

from __future__ import annotations

import io
import os
import pathlib
import tarfile

import numpy as np
import pytest
import torch

Image = pytest.importorskip("PIL.Image")

from stoker.vision import datasets  # noqa: E402
from stoker.vision import transforms as T  # noqa: E402
from stoker.vision.datasets import folder  # noqa: E402


def _jpeg(seed: int, size=(48, 64)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "root"
    for name in ("dog/b.JPG", "dog/a.jpg", "dog/nested/c.jpeg", "cat/z.png", "cat/notes.txt",
                 "ant/x.jpg"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".png"):
            buf = io.BytesIO()
            Image.new("RGB", (40, 30), (10, 20, 30)).save(buf, "PNG")
            path.write_bytes(buf.getvalue())
        else:
            path.write_bytes(_jpeg(len(name)))
    return root


def test_image_folder_finds_torchvisions_classes_and_order(tree) -> None:
    ds = datasets.ImageFolder(str(tree))
    assert ds.classes == ["ant", "cat", "dog"]
    assert ds.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
    rel = [(os.path.relpath(p, tree), t) for p, t in ds.samples]
    assert rel == [("ant/x.jpg", 0), ("cat/z.png", 1), ("dog/a.jpg", 2), ("dog/b.JPG", 2),
                   ("dog/nested/c.jpeg", 2)]
    assert ds.targets == [0, 1, 2, 2, 2] and ds.imgs is ds.samples and len(ds) == 5
    assert ds.extensions == datasets.IMG_EXTENSIONS and ds.root == str(tree)
    image, target = ds[1]
    assert image.mode == "RGB" and image.size == (40, 30) and target == 1


def test_folder_functions(tree) -> None:
    assert datasets.find_classes(tree) == (["ant", "cat", "dog"], {"ant": 0, "cat": 1, "dog": 2})
    only_dogs = datasets.make_dataset(tree, {"dog": 0}, extensions=(".jpg",))
    assert [os.path.basename(p) for p, _ in only_dogs] == ["a.jpg", "b.JPG"]
    assert datasets.has_file_allowed_extension("X.WEBP", datasets.IMG_EXTENSIONS)
    assert folder.is_image_file("a.tiff") and not folder.is_image_file("a.txt")


def test_folder_errors_are_torchvisions(tree, tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        datasets.ImageFolder(str(tree), is_valid_file=lambda p: p.endswith(".png"))
    assert str(info.value) == "Found no valid file for the classes ant, dog. "
    with pytest.raises(FileNotFoundError) as info:
        datasets.DatasetFolder(str(tree), folder.default_loader, extensions=(".txt",))
    assert str(info.value) == ("Found no valid file for the classes ant, dog. Supported "
                               "extensions are: .txt")
    with pytest.raises(FileNotFoundError) as info:
        datasets.DatasetFolder(str(tree), folder.default_loader, extensions=".txt")
    assert str(info.value).endswith("Supported extensions are: .txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        datasets.ImageFolder(str(empty))
    assert str(info.value) == f"Couldn't find any class folder in {empty}."
    with pytest.raises(ValueError) as info:
        datasets.make_dataset(tree, {"dog": 0})
    assert str(info.value) == ("Both extensions and is_valid_file cannot be None or not None "
                               "at the same time")
    with pytest.raises(ValueError) as info:
        datasets.make_dataset(tree, {}, extensions=".jpg")
    assert str(info.value) == (
        "'class_to_index' must have at least one entry to collect any samples.")
    with pytest.raises(ValueError) as info:
        datasets.DatasetFolder.make_dataset(tree, None, extensions=".jpg")  # type: ignore[arg-type]
    assert str(info.value) == "The class_to_idx parameter cannot be None."


def test_allow_empty_keeps_the_empty_classes(tree) -> None:
    ds = datasets.ImageFolder(str(tree), is_valid_file=lambda p: p.endswith(".png"),
                              allow_empty=True)
    assert ds.classes == ["ant", "cat", "dog"] and ds.targets == [1]


def test_a_subclass_chooses_its_classes(tree) -> None:
    class OnlyDogs(datasets.ImageFolder):
        def find_classes(self, directory):
            return ["dog"], {"dog": 0}

    assert OnlyDogs(str(tree)).targets == [0, 0, 0]


def test_getitem_hands_a_fused_compose_the_path(tree) -> None:
    seen = []

    class Spy(T.Compose):
        def __call__(self, img):
            seen.append(img)
            return super().__call__(img)

    fused = Spy([T.RandomResizedCrop(32), T.PILToTensor()])
    image, target = datasets.ImageFolder(str(tree), transform=fused)[2]
    assert isinstance(seen[-1], str) and seen[-1].endswith("a.jpg")
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and target == 2
    datasets.ImageFolder(str(tree), transform=Spy([T.RandomResizedCrop(32), T.PILToTensor()],
                                                  fuse=False))[2]
    assert not isinstance(seen[-1], str)  # no fusion: torchvision's decoded image
    loaded = []
    ds = datasets.ImageFolder(str(tree), transform=fused,
                              loader=lambda p: loaded.append(p) or Image.open(p).convert("RGB"))
    ds[2]
    assert loaded and not isinstance(seen[-1], str)  # a loader of your own is called


def test_fused_and_as_written_give_the_same_sample(tree) -> None:
    for fuse in (True, False):
        torch.manual_seed(0)
        transform = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()],
                              fuse=fuse)
        ds = datasets.ImageFolder(str(tree), transform=transform, target_transform=lambda t: -t)
        items = [ds[i] for i in range(len(ds))]
        if fuse:
            fused = items, torch.get_rng_state()
    assert torch.equal(fused[1], torch.get_rng_state())
    for (a, ta), (b, tb) in zip(fused[0], items, strict=True):
        assert torch.equal(a, b) and ta == tb  # crops of 48 x 64 images to 64: full scale


def test_repr_is_torchvisions(tree) -> None:
    ds = datasets.ImageFolder(str(tree), transform=T.Compose([T.ToTensor()]))
    pad = " " * len("Transform: ")
    assert repr(ds) == (  # torchvision indents the first line of the transforms' repr only
        f"Dataset ImageFolder\n    Number of datapoints: 5\n    Root location: {tree}\n"
        f"    StandardTransform\nTransform: Compose(\n{pad}    ToTensor()\n{pad})")


def _tar(path: pathlib.Path, n: int) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            for ext, data in (("jpg", _jpeg(i, (120, 160))), ("cls", str(i % 3).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _sample_transform(compose: T.Compose):
    def transform(sample: dict) -> tuple:
        return compose(sample["jpg"]), int(sample["cls"])
    return transform


def test_tar_shards_samples(tmp_path) -> None:
    from stoker.formats import TarShards, TarShardStream

    shard = tmp_path / "s-000.tar"
    _tar(shard, 6)
    outputs = {}
    for fuse in (True, False):
        compose = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip(), T.PILToTensor()],
                            fuse=fuse)
        torch.manual_seed(0)
        shards = TarShards(str(shard), transform=_sample_transform(compose))
        stream = TarShardStream([str(shard)], transform=_sample_transform(compose),
                                shuffle_buffer=0)
        outputs[fuse] = [shards[i] for i in range(6)] + list(stream)
    for (a, la), (b, lb) in zip(outputs[True], outputs[False], strict=True):
        assert a.shape == (3, 160, 160) and la == lb
        # crops of 120 x 160 images to 160: decoded at full scale, resized by torch (NOTE
        # [ The fused decode's tensor ending ]) within a level of Pillow's resize
        assert (a.int() - b.int()).abs().max() <= 1


def test_a_datasets_image_column() -> None:
    hf = pytest.importorskip(
        "datasets", reason="Hugging Face datasets is not installed: pip install datasets")
    images = [Image.open(io.BytesIO(_jpeg(i, (90, 120)))) for i in range(4)]
    table = hf.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]}).cast_column(
        "image", hf.Image())
    raw = table.cast_column("image", hf.Image(decode=False))
    compose = T.Compose([T.RandomResizedCrop(128), T.ToTensor()])

    def transform(batch: dict) -> dict:
        return {"pixel_values": [compose(image) for image in batch["image"]],
                "label": batch["label"]}

    table.set_transform(transform)  # each value a PIL image: runs as written
    raw.set_transform(transform)  # each value {"bytes": ..., "path": ...}: decoded fused
    stored = raw.with_format(None)[0]["image"]
    assert set(stored) == {"bytes", "path"} and stored["bytes"][:3] == b"\xff\xd8\xff"  # JPEG
    for i in range(4):
        torch.manual_seed(i)
        from_pil = table[i]["pixel_values"]
        after = torch.get_rng_state()
        torch.manual_seed(i)
        from_bytes = raw[i]["pixel_values"]
        assert torch.equal(after, torch.get_rng_state())
        assert from_pil.shape == from_bytes.shape == (3, 128, 128)
        assert torch.equal(from_pil, from_bytes)  # crops of 90 x 120 to 128: full scale
