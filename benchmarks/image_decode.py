"""The fast image path against plain Pillow, per core: decode a 500x375 JPEG, take a
RandomResizedCrop box (the same draw for both), resize to 224x224 (bilinear), flip, and land as
a uint8 CHW tensor. One thread, no loader: the per-image cost is what the goal is about.

    .venv/bin/python benchmarks/image_decode.py [--images 64] [--rounds 7]

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
