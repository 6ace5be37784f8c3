"""Is the workers' time in ``__getitem__`` mostly an image decode? From sampled stacks
(``worker_stacks.py``), and, when it is, the report's lines: the image-path line to write and
its gain measured on the user's own files (``decode_gain.py``).

A sample counts when a thread of the worker is inside ``__getitem__``/``__getitems__``; it
counts as decode when that thread is in a frame that decodes or resizes an image: Pillow's
(``ImageFile.load``, the JPEG plugin, ``Image.resize``/``reduce``/``draft``), torchvision's
(``torchvision.io`` ``decode_jpeg``/``decode_image``/``read_image``, its ``resize``), or a
line calling OpenCV's ``imdecode``/``imread``/``resize`` or another ``decode_jpeg`` (a C
function shows as the Python line that called it: NOTE [ Sampling the workers' stacks ]).
A thread already in ``stoker/image/`` is on stoker's image path: nothing to recommend.
"""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from stoker.doctor.decode_gain import Gain
from stoker.vision.import_gain import ImportGain

MOST = 0.5  # "most of the time in __getitem__"
MIN_SAMPLES = 5  # fewer samples in __getitem__ say nothing

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_PIL: dict[str, set[str] | None] = {"ImageFile.py": None, "JpegImagePlugin.py": None,
        "Image.py": {"resize", "reduce", "draft", "thumbnail", "load"}}
_TORCHVISION = {"decode_jpeg", "decode_image", "read_image", "resize", "_resize_image_pil",
                "resize_image"}
_C_CALL = re.compile(r"\b(imdecode|imread|decode_jpeg|read_image)\s*\(|\bcv2\.resize\s*\(")
_GETITEM = {"__getitem__", "__getitems__"}


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str


@dataclass(frozen=True)
class DecodeShare:
    samples: int  # dumps with a thread in __getitem__
    decode: int  # of them, in an image decode or resize
    on_image_path: int  # of them, already in stoker.image
    where: tuple[str, ...]  # the decode frames seen, most frequent first

    @property
    def share(self) -> float:
        return self.decode / self.samples if self.samples else 0.0

    @property
    def decode_bound(self) -> bool:
        return self.samples >= MIN_SAMPLES and self.share >= MOST


def threads(dump: str) -> list[list[Frame]]:
    """A faulthandler dump's threads, each its frames most recent first."""
    found: list[list[Frame]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            found.append([])
        elif (m := _FRAME.match(line)) and found:
            found[-1].append(Frame(m["file"], int(m["line"]), m["func"].strip()))
    return found


def decode_frame(frame: Frame, innermost: bool) -> str | None:
    """A name for ``frame`` if it decodes or resizes an image, else None."""
    path = frame.file.replace("\\", "/")
    if frame.func == "<module>":
        return None  # an import, not a decode
    if "/PIL/" in path:
        funcs = _PIL.get(path.rsplit("/", 1)[-1], set())
        if funcs is None or frame.func in funcs:
            return f"Pillow {path.rsplit('/', 1)[-1][:-3]}.{frame.func}"
    if "/torchvision/" in path and frame.func in _TORCHVISION:
        return f"torchvision {frame.func}"
    if innermost and (m := _C_CALL.search(linecache.getline(frame.file, frame.line))):
        return m.group(0).rstrip("( ")
    return None


def _on_path(file: str) -> bool:
    """A frame of stoker's image path: ``stoker.image``, or ``stoker.vision``'s fused decode."""
    path = file.replace("\\", "/")
    return "/stoker/image/" in path or "/stoker/vision/transforms/_fused" in path


def decode_share(dumps: Iterable[str]) -> DecodeShare:
    samples = decode = on_path = 0
    where: dict[str, int] = {}
    for dump in dumps:
        busy = [t for t in threads(dump) if any(f.func in _GETITEM for f in t)]
        if not busy:
            continue
        samples += 1
        frames = busy[0][:next(k for k, f in enumerate(busy[0]) if f.func in _GETITEM) + 1]
        if any(_on_path(f.file) for f in frames):
            on_path += 1
            continue
        names = [n for k, f in enumerate(frames) if (n := decode_frame(f, k == 0))]
        if names:
            decode += 1
            chain = " > ".join(dict.fromkeys(reversed(names)))  # what was called, then inside
            where[chain] = where.get(chain, 0) + 1
    ranked = tuple(sorted(where, key=lambda n: -where[n]))
    return DecodeShare(samples, decode, on_path, ranked)


LINE = "img = stoker.image.decode_crop_into(jpeg_bytes, out, stoker.sample_rng())"


NOT_INPUT_BOUND = ("  (training is not input-bound now: this frees CPU, it does not speed "
                   "training)")


def _head(share: DecodeShare) -> str:
    """The DECODE block's first line: how much of the sampled time is a decode."""
    seen = ", ".join(share.where[:3])
    return (f"DECODE  {share.share:.0%} of your workers' sampled time in __getitem__ is "
            f"decoding and resizing images ({seen}; {share.decode} of {share.samples} stack "
            "samples)")


def report_lines(share: DecodeShare, gain: Gain | None, why_not: str,
                 input_bound: bool) -> list[str]:
    """The DECODE block of the report."""
    out = [_head(share),
           "  stoker's image path decodes, random-resized-crops and flips in one call, "
           "decoding only at the scale the crop needs:",
           f"    {LINE}   # out: uint8 [3, H, W]"]
    if gain is None:
        out.append(f"  gain not measured: {why_not}")
    else:
        out.append(f"  measured on {gain.images} of your JPEGs, one core: {gain.ratio:.2f}x "
                   f"Pillow's decode + crop + resize + flip ({gain.pillow_ms:.2f} -> "
                   f"{gain.image_path_ms:.2f} ms per image, to {gain.size}x{gain.size}; "
                   f"{gain.decoder})")
    if not input_bound:
        out.append(NOT_INPUT_BOUND)
    out.append("  see docs/image_path.md")
    return out


def summary(share: DecodeShare, gain: Gain | None, why_not: str) -> dict[str, object]:
    """The finding as data (``--json``)."""
    return {"samples": share.samples, "decode_samples": share.decode, "share": share.share,
            "on_image_path": share.on_image_path, "where": list(share.where),
            "decode_bound": share.decode_bound, "line": LINE,
            "gain": None if gain is None else gain.as_dict(), "not_measured": why_not}


@dataclass(frozen=True)
class DecodeFinding:
    share: DecodeShare
    lines: tuple[str, ...]  # the report's DECODE block (none when not decode-bound)
    data: dict[str, object]  # for --json


NOT_FOUND = ("no JPEG files found through your dataset (the doctor reads the paths in its "
             "paths, files, image_paths, filenames, file_paths, samples or imgs attribute)")


# What one H200 decoded through stoker's loader with DecodeImages, and its CPU cost an image
# (docs/gpu_feed.md, the 2026-12-04 record): what the CPU image path's rate per GPU is weighed
# against.
GPU_DECODE_IMAGES_S = 6_700
GPU_DECODE_CPU_MS = 0.27


def where_to_decode(per_core_ms: float, cores: int, gpus: int) -> str | None:
    """The DECODE block's line on the CPU against the GPU, from this machine's cores per GPU
    and a per-core decode time measured on the user's files; None without a GPU."""
    if gpus < 1 or per_core_ms <= 0:
        return None
    per_gpu = cores / gpus
    rate = per_gpu * 1000 / per_core_ms
    cpu_wins = rate >= GPU_DECODE_IMAGES_S
    return (f"  {per_gpu:g} cores per GPU here decode about {rate:,.0f} images/s per GPU on "
            f"the CPU path ({per_core_ms:.2f} ms a core); one H200 decoding through the "
            f"loader gave {GPU_DECODE_IMAGES_S:,} at {GPU_DECODE_CPU_MS} CPU ms an image, on "
            "the training thread: " + (
                "decode on the CPU (above)" if cpu_wins else
                "where your model needs more images/s than the CPU path gives, decode on the "
                "GPU with device_transform=stoker.image.DecodeImages(size=...)")
            + " (docs/gpu_feed.md, \"Which decode\")")


def _gpus() -> int:
    """GPUs this process sees, without starting CUDA (NVML where torch has it)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.version.cuda else 0
    except Exception:  # a broken driver: no advice about GPUs
        return 0


def find(dumps: Iterable[str], dataset: object, input_bound: bool) -> DecodeFinding | None:
    """The finding for a run's sampled stacks; None when no sample was in ``__getitem__``.
    The gain is measured (about a second) only when the decode is most of the time."""
    from stoker.doctor.decode_gain import jpeg_samples, measure_gain

    share = decode_share(dumps)
    if not share.samples:
        return None
    if not share.decode_bound:
        return DecodeFinding(share, (), summary(share, None, "not decode-bound"))
    one_import = import_gain(dataset)
    cores, gpus = os.cpu_count() or 1, _gpus()

    def block(lines: list[str], per_core_ms: float | None) -> tuple[str, ...]:
        """The block with the where-to-decode line before its closing "see docs" line."""
        where = None if per_core_ms is None else where_to_decode(per_core_ms, cores, gpus)
        return tuple(lines[:-1] + ([where] if where else []) + lines[-1:])

    if one_import is not None:
        return DecodeFinding(share, block(import_lines(share, one_import, input_bound),
                                          one_import.fused_ms),
                             {**summary(share, None, ""), "import": one_import.as_dict()})
    gain = measure_gain(jpeg_samples(dataset))
    why_not = "" if gain is not None else NOT_FOUND
    return DecodeFinding(share, block(report_lines(share, gain, why_not, input_bound),
                                      None if gain is None else gain.image_path_ms),
                         summary(share, gain, why_not))


def import_gain(dataset: object) -> ImportGain | None:
    """The ``stoker.vision`` import's gain for a torchvision folder pipeline, else None."""
    if not type(dataset).__module__.startswith(("torchvision.", "stoker.vision.")):
        return None
    from stoker.vision.import_gain import measure

    return measure(dataset, budget_s=1.0)


def import_lines(share: DecodeShare, gain: ImportGain, input_bound: bool) -> list[str]:
    """The DECODE block when the dataset is torchvision's folder pipeline: the import."""
    from stoker.vision.import_gain import IMPORT

    out = [_head(share),
           "  your dataset is torchvision's folder pipeline: change one import, and its "
           "Compose decodes only the crop it keeps (same crops, flips and seeds):",
           f"    {IMPORT}",
           f"  measured on {gain.images} of your JPEGs, one core: {gain.ratio:.2f}x your "
           f"transform ({gain.as_written_ms:.2f} -> {gain.fused_ms:.2f} ms per image)"]
    if not input_bound:
        out.append(NOT_INPUT_BOUND)
    out.append("  see docs/vision.md")
    return out
