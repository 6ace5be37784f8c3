"""The doctor's decode verdict from workers' faulthandler dumps (decode_verdict.py) and the
image path's gain measured on JPEG bytes found through a dataset (decode_gain.py)."""

from __future__ import annotations

from pathlib import Path

from stoker.doctor.decode_gain import jpeg_samples
from stoker.doctor.decode_verdict import DecodeShare, decode_share, report_lines, threads

IDLE = '''Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/site/stoker/workers/watch.py", line 40 in _run

Current thread 0x00007f0000000002 (most recent call first):
  File "/site/stoker/workers/main_loop.py", line 90 in _receive
  File "/site/stoker/workers/main_loop.py", line 60 in run
'''

PILLOW = '''Current thread 0x00007f0000000002 (most recent call first):
  File "/site/PIL/ImageFile.py", line 291 in load
  File "/site/PIL/Image.py", line 2200 in resize
  File "/home/me/train.py", line 30 in __getitem__
  File "/site/stoker/fetch/fetchers.py", line 150 in fetch
'''

PYTHON = '''Current thread 0x00007f0000000002 (most recent call first):
  File "/home/me/train.py", line 12 in _spin
  File "/home/me/train.py", line 30 in __getitem__
'''

ON_PATH = '''Current thread 0x00007f0000000002 (most recent call first):
  File "/site/stoker/image/decode.py", line 140 in _decode_scaled
  File "/home/me/train.py", line 30 in __getitem__
'''


def test_a_dump_is_read_as_threads_of_frames_most_recent_first() -> None:
    found = threads(IDLE)
    assert [[f.func for f in t] for t in found] == [["wait", "_run"], ["_receive", "run"]]
    assert found[1][0].file == "/site/stoker/workers/main_loop.py" and found[1][0].line == 90


def test_pillow_frames_in_getitem_count_as_decode_and_idle_dumps_not_at_all() -> None:
    share = decode_share([PILLOW, PILLOW, PILLOW, PYTHON, PYTHON, IDLE, IDLE])
    assert share == DecodeShare(samples=5, decode=3, on_image_path=0,
                                where=("Pillow Image.resize > Pillow ImageFile.load",))
    assert share.share == 0.6 and share.decode_bound


def test_too_few_samples_or_python_work_is_not_decode_bound() -> None:
    assert not decode_share([PILLOW] * 4).decode_bound  # fewer than 5 in __getitem__
    assert not decode_share([PILLOW] * 2 + [PYTHON] * 4).decode_bound


def test_an_opencv_call_is_seen_through_the_line_that_made_it(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_text("import cv2\n\n\ndef get(data):\n    return cv2.imdecode(data, 1)\n")
    dump = ("Current thread 0x1 (most recent call first):\n"
            f'  File "{source}", line 5 in __getitem__\n')
    assert decode_share([dump] * 5).where == ("imdecode",)


def test_stoker_image_path_is_not_recommended_again() -> None:
    share = decode_share([ON_PATH] * 6)
    assert (share.samples, share.decode, share.on_image_path) == (6, 0, 6)
    assert not share.decode_bound


def test_the_report_says_when_the_gain_was_not_measured() -> None:
    share = decode_share([PILLOW] * 5)
    lines = report_lines(share, None, "no JPEG files found", input_bound=True)
    assert lines == [
        "DECODE  100% of your workers' sampled time in __getitem__ is decoding and resizing "
        "images (Pillow Image.resize > Pillow ImageFile.load; 5 of 5 stack samples)",
        "  stoker's image path decodes, random-resized-crops and flips in one call, decoding "
        "only at the scale the crop needs:",
        "    img = stoker.image.decode_crop_into(jpeg_bytes, out, stoker.sample_rng())   "
        "# out: uint8 [3, H, W]",
        "  gain not measured: no JPEG files found",
        "  see docs/image_path.md",
    ]


class _Folder:
    def __init__(self, samples: list[tuple[str, int]]) -> None:
        self.samples = samples


def test_jpeg_bytes_come_from_the_paths_a_dataset_keeps(tmp_path: Path) -> None:
    jpeg, text = tmp_path / "a.jpg", tmp_path / "b.txt"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0 not really decoded here")
    text.write_bytes(b"hello")
    assert jpeg_samples(_Folder([(str(jpeg), 0), (str(text), 1)])) == [jpeg.read_bytes()]
    assert jpeg_samples(_Folder([(str(text), 1)])) == []
    assert jpeg_samples(object()) == []


FUSED = '''Current thread 0x00007f0000000002 (most recent call first):
  File "/site/stoker/vision/transforms/_fused.py", line 120 in decode_scaled
  File "/site/stoker/vision/transforms/_compose.py", line 80 in _call_encoded
  File "/site/stoker/vision/datasets/folder.py", line 200 in __getitem__
'''


def test_stoker_vision_fused_decode_is_on_the_path() -> None:
    share = decode_share([FUSED] * 6)
    assert (share.samples, share.decode, share.on_image_path) == (6, 0, 6)


def test_a_torchvision_folder_pipeline_is_told_the_import(tmp_path: Path) -> None:
    import io

    import pytest

    Image = pytest.importorskip("PIL.Image")
    from stoker.doctor.decode_verdict import find
    from stoker.vision import datasets
    from stoker.vision import transforms as T

    for i in range(3):
        (tmp_path / "a").mkdir(exist_ok=True)
        out = io.BytesIO()
        Image.new("RGB", (120, 90), (i, 2 * i, 3 * i)).save(out, "JPEG")
        (tmp_path / "a" / f"{i}.jpg").write_bytes(out.getvalue())
    compose = T.Compose([T.RandomResizedCrop(32), T.ToTensor()], fuse=False)
    finding = find([PILLOW] * 5, datasets.ImageFolder(str(tmp_path), compose), input_bound=True)
    assert finding is not None and finding.data["import"]["images"] == 3
    gain = finding.data["import"]
    assert finding.lines[1:] == (
        "  your dataset is torchvision's folder pipeline: change one import, and its Compose "
        "decodes only the crop it keeps (same crops, flips and seeds):",
        "    from torchvision import datasets, transforms  ->  "
        "from stoker.vision import datasets, transforms",
        f"  measured on 3 of your JPEGs, one core: {gain['ratio']:.2f}x your transform "
        f"({gain['as_written_ms']:.2f} -> {gain['fused_ms']:.2f} ms per image)",
        "  see docs/vision.md",
    )
    other = find([PILLOW] * 5, _Folder([(str(tmp_path / "a" / "0.jpg"), 0)]), input_bound=True)
    assert other is not None and "import" not in other.data  # not a folder pipeline


def test_where_to_decode_weighs_the_cpu_path_per_gpu_against_one_gpu_decoding() -> None:
    from stoker.doctor.decode_verdict import where_to_decode

    assert where_to_decode(2.0, 16, 0) is None  # no GPU: nothing to weigh
    many = where_to_decode(2.0, 32, 1)  # 32 cores at 500 images/s each: 16,000 per GPU
    assert many is not None and many.startswith(
        "  32 cores per GPU here decode about 16,000 images/s per GPU on the CPU path "
        "(2.00 ms a core); one H200 decoding through the loader gave 6,700")
    assert "decode on the CPU (above)" in many and "DecodeImages" not in many
    few = where_to_decode(2.0, 16, 8)  # 2 cores per GPU: 1,000 images/s per GPU
    assert few is not None and "2 cores per GPU here decode about 1,000 images/s" in few
    assert "device_transform=stoker.image.DecodeImages(size=...)" in few
    assert few.endswith('(docs/gpu_feed.md, "Which decode")')
