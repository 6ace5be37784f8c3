"""What ``stoker pack`` writes for one sample (``_records``): the key and field rules that keep
samples from merging on read, how values become bytes, and ``--max-side`` re-encoding (label
images keep their values, EXIF and ICC are kept, every listed format is resized)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch

from stoker.formats._records import (
    DatasetRecords,
    PackError,
    encode_field,
    packed_record,
    shrink_image,
)

PIL = pytest.importorskip("PIL.Image")
RNG = np.random.default_rng(0)
PHOTO = RNG.integers(0, 255, (64, 80, 3), dtype=np.uint8)


def record(sample: Any, max_side: int | None = None) -> tuple[str, dict[str, bytes]]:
    return packed_record(DatasetRecords([sample], None, "list"), 0, max_side, 90)


def refusal(sample: Any) -> str:
    with pytest.raises(PackError) as info:
        record(sample)
    return str(info.value)


@pytest.mark.parametrize(("key", "problem"), [
    ("img.0", "has a dot in its last path part: readers split the member name there, so it "
              "would read back as 'img'"),
    ("a/", "is empty or has an empty path part (a leading, trailing or double '/')"),
    ("../up", "has a path part starting with '.' (hidden, or '..'), which readers skip or "
              "extract outside their directory"),
    ("__meta__/x", "starts with a __name__ part, which readers skip as metadata"),
])
def test_keys_that_read_back_different_are_refused(key: str, problem: str) -> None:
    assert refusal({"__key__": key, "txt": "x"}) == (
        f"sample 0 of list: its __key__ {key!r} {problem}; give it a key such as 'img_0' or "
        "'train/000001'"
    )


def test_a_key_that_is_not_a_str_is_refused() -> None:
    assert refusal({"__key__": 5.0, "txt": "x"}) == (
        "sample 0 of list: its __key__ 5.0 is of type float; give a str (keys name tar "
        "members), without a dot in its last part, e.g. f'{index:09d}'"
    )


def test_samples_without_fields_and_fields_differing_by_case_are_refused() -> None:
    assert refusal({"__key__": "a", "__url__": "s.tar"}) == (
        "sample 0 of list: it has no fields (['__url__']); every sample needs at least one, "
        "such as {'jpg': jpeg_bytes} (a sample without members reads back as none)"
    )
    assert refusal({"JPG": b"x", "jpg": b"y"}) == (
        "sample 0 of list: fields ['JPG', 'jpg'] differ only by case; readers lower-case field "
        "names: rename one of them"
    )


def test_fields_are_lower_cased_and_reader_metadata_is_not_packed() -> None:
    key, fields = record({"__key__": "dir/k", "__url__": "/a/s.tar", "Cls": 1, "seg.PNG": b"p"})
    assert (key, fields) == ("dir/k", {"cls": b"1", "seg.png": b"p"})


def test_pil_images_and_uint8_arrays_are_encoded_as_their_field_s_format() -> None:
    expected = io.BytesIO()
    PIL.fromarray(PHOTO).save(expected, format="JPEG", quality=95)
    chw = torch.from_numpy(PHOTO).permute(2, 0, 1)
    for value in (PIL.fromarray(PHOTO), chw, PHOTO):  # tensors are CHW, arrays HWC
        assert encode_field("jpg", value, 95) == expected.getvalue()
    png = encode_field("seg.png", PHOTO[:, :, 0], 95)
    assert np.array_equal(np.array(PIL.open(io.BytesIO(png))), PHOTO[:, :, 0])


def test_values_an_image_field_cannot_hold_are_refused() -> None:
    assert refusal({"jpg": torch.zeros(3, 4, 5)}) == (
        "sample 0 of list: field 'jpg': a torch.float32 Tensor of shape (3, 4, 5) is not an "
        "image to store as JPEG; give uint8 as a (C, H, W) tensor with 1, 3 or 4 channels (or "
        "(H, W)), or store it under 'npy' or 'pth'"
    )
    assert refusal({"jpg": PIL.fromarray(PHOTO).convert("RGBA")}) == (
        "sample 0 of list: field 'jpg': a mode RGBA image cannot be saved as JPEG (cannot write "
        "mode RGBA as JPEG); convert it first (e.g. image.convert('RGB')) or use a field of a "
        "format that holds it (png)"
    )


def test_an_error_in_the_dataset_names_the_sample_and_where_it_was_raised() -> None:
    class Broken:
        def __len__(self) -> int:
            return 1

        def __getitem__(self, index: int) -> Any:
            raise KeyError("label")

    with pytest.raises(PackError) as info:
        packed_record(DatasetRecords(Broken(), None, "Broken"), 0, None, 90)
    line = Broken.__getitem__.__code__.co_firstlineno + 1
    assert str(info.value) == (
        f"sample 0 of Broken: KeyError: 'label' (at {__file__}:{line} in __getitem__)"
    )
    assert isinstance(info.value.__cause__, KeyError)


def encoded(image: Any, image_format: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format=image_format, **options)
    return out.getvalue()


def test_max_side_resizes_label_images_with_nearest_and_photos_bicubically() -> None:
    mask = np.zeros((300, 400), np.uint8)
    mask[50:200, 100:250], mask[150:280, 200:350] = 5, 10
    photo = PIL.fromarray(mask)  # the same values, as a bare field's grayscale photo
    _, fields = record({"png": encoded(photo, "PNG"), "seg.png": encoded(photo, "PNG"),
                        "ids.tif": encoded(PIL.fromarray(mask.astype(np.uint16)), "TIFF")}, 100)
    resized = {name: PIL.open(io.BytesIO(data)) for name, data in fields.items()}
    assert {name: image.size for name, image in resized.items()} == {
        "png": (100, 75), "seg.png": (100, 75), "ids.tif": (100, 75)}
    assert set(np.unique(np.array(resized["seg.png"]))) == {0, 5, 10}
    assert set(np.unique(np.array(resized["ids.tif"]))) == {0, 5, 10}
    assert len(np.unique(np.array(resized["png"]))) > 3  # interpolated edges


def test_max_side_keeps_exif_orientation_and_icc_profile() -> None:
    from PIL import ImageCms

    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    exif = PIL.Exif()
    exif[0x0112] = 6
    for image_format, name in (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")):
        data = encoded(PIL.fromarray(PHOTO), image_format, exif=exif.tobytes(), icc_profile=icc)
        with PIL.open(io.BytesIO(shrink_image(name, data, 40, 90))) as image:
            assert (image.size, image.getexif().get(0x0112), image.info.get("icc_profile")) == (
                (40, 32), 6, icc), name


@pytest.mark.parametrize(("name", "image_format"), [("bmp", "BMP"), ("tif", "TIFF"),
                                                    ("ppm", "PPM")])
def test_max_side_resizes_bmp_tif_and_ppm(name: str, image_format: str) -> None:
    data = encoded(PIL.fromarray(PHOTO), image_format)
    with PIL.open(io.BytesIO(shrink_image(name, data, 40, 90))) as image:
        assert (image.format, image.size) == (image_format, (40, 32))


def test_max_side_leaves_animations_and_unreadable_images_alone_or_refuses() -> None:
    frames = [PIL.fromarray(PHOTO), PIL.fromarray(255 - PHOTO)]
    data = encoded(frames[0], "PNG", save_all=True, append_images=frames[1:])
    assert shrink_image("png", data, 40, 90) == data  # one frame of it would be wrong
    with pytest.raises(PackError) as info:
        record({"jpg": b"not an image"}, max_side=40)
    assert str(info.value) == (
        "sample 0 of list: field 'jpg' is not an image Pillow can read "
        "(UnidentifiedImageError), so --max-side cannot resize it"
    )
