"""The fast image path against plain Pillow, per core: decode a 500x375 JPEG, take a
RandomResizedCrop box (the same draw for both), resize to 224x224 (bilinear), flip, and land as
a uint8 CHW tensor. One thread, no loader: the per-image cost is what the goal is about.

    .venv/bin/python benchmarks/image_decode.py [--images 64] [--rounds 7]

With PyTurboJPEG importable (``pip install "PyTurboJPEG<2"`` and Debian's ``libturbojpeg0``,
whose 2.1.5 has no cropped decode), two more variants show why stoker decodes with simplejpeg:
PyTurboJPEG's scaled decode in place of simplejpeg's (same crop and resize), and its lossless
MCU-aligned crop (``tjTransform``) followed by the scaled decode of the crop, the one way to
"decode only the crop" that TurboJPEG 2 offers.

Prints a JSON record per variant and the speedup of each over Pillow (median of interleaved
rounds; the spread of the per-round ratios says how noisy the machine was).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine_info  # noqa: E402

import stoker.image.decode as fast  # noqa: E402
from stoker.image import decode_crop_into, random_resized_crop_box  # noqa: E402


def photo_like_jpegs(n: int, seed: int = 0) -> list[bytes]:
    """500x375 q90 JPEGs with smooth structure plus sensor-like noise (compress like photos)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500].astype(np.float32)
    out = []
    for k in range(n):
        f1, f2 = rng.uniform(5, 40, 2)
        base = np.stack([(x * 0.5 + 60 * np.sin(y / f1 + k)) % 256,
                         (y * 0.6 + 50 * np.cos(x / f2 - k)) % 256,
                         (x + y + 20 * k) % 256], -1)
        img = (base + rng.normal(0, 10, base.shape)).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def pillow_plain(jpeg: bytes, out: torch.Tensor, rng: np.random.Generator) -> None:
    """What a torchvision-style __getitem__ does with Pillow alone."""
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    top, left, h, w = random_resized_crop_box(rng, img.height, img.width)
    img = img.crop((left, top, left + w, top + h)).resize((224, 224), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    out.copy_(torch.from_numpy(np.array(img)).permute(2, 0, 1))


def stoker_fast(jpeg: bytes, out: torch.Tensor, rng: np.random.Generator) -> None:
    decode_crop_into(jpeg, out, rng)


def stoker_pillow_only(jpeg: bytes, out: torch.Tensor, rng: np.random.Generator) -> None:
    saved = fast._simplejpeg, fast._cv2
    fast._simplejpeg, fast._cv2 = None, None
    try:
        decode_crop_into(jpeg, out, rng)
    finally:
        fast._simplejpeg, fast._cv2 = saved


VARIANTS = {"pillow": pillow_plain, "stoker": stoker_fast, "stoker_pillow_only": stoker_pillow_only}


def _turbojpeg_variants() -> dict[str, object]:
    """PyTurboJPEG's two ways, when it and its library load (else none)."""
    try:
        import cv2
        import turbojpeg
        tj = turbojpeg.TurboJPEG()
    except (ImportError, OSError, RuntimeError):
        return {}
    flags = turbojpeg.TJFLAG_FASTDCT | turbojpeg.TJFLAG_FASTUPSAMPLE  # as stoker's decode
    factors = sorted((f for f in tj.scaling_factors if f[0] <= f[1]), key=lambda f: f[0] / f[1])

    def decode_resize(jpeg: bytes, box: tuple, origin: tuple, out: torch.Tensor,
                      flip: bool) -> None:
        top, left, h, w = box
        need = max(224 / h, 224 / w)
        num, den = next((f for f in factors if f[0] / f[1] >= need), (1, 1))
        img = tj.decode(jpeg, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=(num, den),
                        flags=flags)
        s = num / den
        y0, x0 = (top - origin[0]) * s, (left - origin[1]) * s
        crop = img[round(y0):round(y0 + h * s), round(x0):round(x0 + w * s)]
        r = cv2.resize(crop, (224, 224), interpolation=cv2.INTER_LINEAR)
        out.numpy()[...] = (r[:, ::-1] if flip else r).transpose(2, 0, 1)

    def scaled(jpeg: bytes, out: torch.Tensor, rng: np.random.Generator) -> None:
        width, height = fast._jpeg_size(jpeg)
        box = random_resized_crop_box(rng, height, width)
        decode_resize(jpeg, box, (0, 0), out, bool(rng.random() < 0.5))

    def lossless_crop(jpeg: bytes, out: torch.Tensor, rng: np.random.Generator) -> None:
        width, height = fast._jpeg_size(jpeg)
        top, left, h, w = box = random_resized_crop_box(rng, height, width)
        y, x = top - top % 16, left - left % 16  # the MCU grid of 4:2:0
        cropped = tj.crop(jpeg, x, y, w + left - x, h + top - y)
        decode_resize(cropped, box, (y, x), out, bool(rng.random() < 0.5))

    return {"pyturbojpeg_scaled": scaled, "pyturbojpeg_lossless_crop": lossless_crop}


VARIANTS.update(_turbojpeg_variants())  # type: ignore[arg-type]


def run_once(fn, jpegs: list[bytes]) -> float:
    batch = torch.empty((len(jpegs), 3, 224, 224), dtype=torch.uint8)
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    for i, jpeg in enumerate(jpegs):
        fn(jpeg, batch[i], rng)
    return (time.perf_counter() - start) / len(jpegs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if fast._cv2 is not None:
        fast._cv2.setNumThreads(1)
    jpegs = photo_like_jpegs(args.images)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for fn in VARIANTS.values():
        run_once(fn, jpegs[:8])  # warm-up
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
            times[name].append(run_once(VARIANTS[name], jpegs))
    base = times["pillow"]
    for name, values in times.items():
        ratios = [b / v for b, v in zip(base, values, strict=True)]
        print(json.dumps({
            "workload": "image_decode_500x375_to_224", "variant": name,
            "ms_per_image": round(1e3 * statistics.median(values), 3),
            "images_per_s_per_core": round(1 / statistics.median(values), 1),
            "speedup_vs_pillow": round(statistics.median(ratios), 3),
            "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "simplejpeg": fast._simplejpeg is not None, "opencv": fast._cv2 is not None,
            "machine": machine_info(),
        }))


if __name__ == "__main__":
    main()
