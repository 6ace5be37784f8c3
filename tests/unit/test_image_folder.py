"""``ImageFolder`` follows torchvision's rules (real files; torchvision itself has no CPU build
here to compare with, so its rules are spelled out): classes are the sorted subdirectory names,
files are walked in sorted order through nested directories, extensions match case-
insensitively, other files are skipped, an empty class or root is an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.formats import ImageFolder


def _touch(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_classes_files_and_labels_follow_torchvisions_rules(tmp_path: Path) -> None:
    _touch(tmp_path / "zebra" / "b.PNG", b"z-b")
    _touch(tmp_path / "zebra" / "a.jpeg", b"z-a")
    _touch(tmp_path / "ant" / "sub" / "x.webp", b"a-x")
    _touch(tmp_path / "ant" / "c.JPG", b"a-c")
    _touch(tmp_path / "ant" / "readme.txt", b"skip")
    _touch(tmp_path / "loose.jpg", b"not in a class")
    ds = ImageFolder(str(tmp_path), decode="bytes")
    assert ds.classes == ["ant", "zebra"] and ds.class_to_idx == {"ant": 0, "zebra": 1}
    assert list(ds.paths) == ["ant/c.JPG", "ant/sub/x.webp", "zebra/a.jpeg", "zebra/b.PNG"]
    assert [ds[i] for i in range(len(ds))] == [(b"a-c", 0), (b"a-x", 0), (b"z-a", 1),
                                                (b"z-b", 1)]
    flipped = ImageFolder(str(tmp_path), decode="bytes", transform=bytes.upper,
                          target_transform=lambda t: -t)
    assert flipped[3] == (b"Z-B", -1)


def test_an_empty_class_is_an_error(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "1.jpg", b"x")
    (tmp_path / "b").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        ImageFolder(str(tmp_path), decode="bytes")
    assert str(info.value) == (
        f"{tmp_path}: no files with an extension in .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, "
        ".tiff, .webp in the class directories ['b']; remove them or pass extensions="
    )


def test_no_class_directories_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        ImageFolder(str(tmp_path), decode="bytes")
    assert str(info.value) == (
        f"{tmp_path}: no class directories; an image folder holds one subdirectory per class "
        "(root/cat/001.jpg, root/dog/002.jpg, ...)"
    )


def test_a_file_or_a_missing_path_is_no_image_folder(tmp_path: Path) -> None:
    photo = tmp_path / "0000.jpg"
    photo.write_bytes(b"\xff\xd8")
    with pytest.raises(NotADirectoryError) as file:
        ImageFolder(str(photo), decode="bytes")
    assert str(file.value) == (
        f"{photo} is a file; an image folder is a directory holding one subdirectory per class "
        "(root/cat/001.jpg, root/dog/002.jpg, ...)")
    with pytest.raises(FileNotFoundError) as missing:
        ImageFolder(str(tmp_path / "nope"), decode="bytes")
    assert str(missing.value) == (
        f"{tmp_path / 'nope'} does not exist; an image folder is a directory holding one "
        "subdirectory per class (root/cat/001.jpg, root/dog/002.jpg, ...)")


def test_pil_decoding_gives_rgb(tmp_path: Path) -> None:
    image_module = pytest.importorskip("PIL.Image")
    (tmp_path / "c").mkdir()
    image_module.new("L", (3, 2), 7).save(tmp_path / "c" / "g.png")
    image, label = ImageFolder(str(tmp_path))[0]
    assert (image.mode, image.size, label) == ("RGB", (3, 2), 0)
