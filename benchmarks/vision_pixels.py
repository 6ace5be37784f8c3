"""How far `stoker.vision`'s fused decode lands from the list run as written: the table of
docs/vision.md ("The pixels").

    .venv/bin/python benchmarks/vision_pixels.py [--seeds 40]

For each image and decoder (simplejpeg; Pillow only), and each ending (a tensor conversion:
the resize is torch's; a PIL image: Pillow's), `RandomResizedCrop(224)` + flip over `--seeds`
seeds and `Resize(256)` + `CenterCrop(224)` once, against `fuse=False`, in levels of 255 (uint8
outputs). Prints one row per (images, decoder, ending): train's samples decoded at full scale,
the largest difference of any pixel, the mean difference over the samples (the worst image's
in brackets); eval's largest and mean.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from stoker.vision import transforms as T  # noqa: E402
from stoker.vision.transforms import _fused  # noqa: E402


def _by_hand(img: Any) -> torch.Tensor:
    return T.PILToTensor()(img)  # not a conversion the fused path knows: a PIL ending


def _lists(tensor_ending: bool) -> tuple[list[Any], list[Any]]:
    convert = T.PILToTensor() if tensor_ending else _by_hand
    return ([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), convert],
            [T.Resize(256), T.CenterCrop(224), convert])


def _diff(transforms: list[Any], jpeg: bytes, seed: int) -> tuple[torch.Tensor, bool]:
    torch.manual_seed(seed)
    height, width = _fused.jpeg_size(jpeg) or (0, 0)
    first = transforms[0]
    if isinstance(first, T.RandomResizedCrop):
        _, _, h, w = T.RandomResizedCrop.get_params(
            torch.empty(3, height, width), first.scale, first.ratio)
        full = 224 / h >= 1 or 224 / w >= 1
    else:
        full = False
    torch.manual_seed(seed)
    fused = T.Compose(transforms)(jpeg)
    torch.manual_seed(seed)
    plain = T.Compose(transforms, fuse=False)(jpeg)
    return (fused.int() - plain.int()).abs(), full


def _images() -> dict[str, list[bytes]]:
    from test_vision_compose import photo_like

    sets = {
        "photo-like 500x375 (8)": [photo_like(375, 500, seed=k) for k in range(8)],
        "photo-like 900x1200 (8)": [photo_like(1200, 900, seed=k) for k in range(8)],
    }
    try:
        from matplotlib import cbook

        with cbook.get_sample_data("grace_hopper.jpg") as f:
            sets["grace_hopper.jpg 512x600"] = [f.read()]
    except (ImportError, OSError):
        pass
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(noise).save(out, "JPEG", quality=90)
    sets["uniform noise 500x375 (worst case)"] = [out.getvalue()]
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    args = parser.parse_args()
    simplejpeg = _fused._simplejpeg
    print("| images | decoder | ending | train: full scale; max; mean (worst image) "
          "| eval: max; mean |")
    print("| --- | --- | --- | --- | --- |")
    for name, jpegs in _images().items():
        for decoder in ("simplejpeg", "Pillow only"):
            _fused._simplejpeg = simplejpeg if decoder == "simplejpeg" else None
            for tensor_ending in (True, False):
                train, evaluate = _lists(tensor_ending)
                full, worst, means = 0, 0, []
                per_image = []
                for jpeg in jpegs:
                    image_means = []
                    for seed in range(args.seeds):
                        diff, at_full = _diff(train, jpeg, seed)
                        full += at_full
                        worst = max(worst, int(diff.max()))
                        image_means.append(float(diff.float().mean()))
                    means += image_means
                    per_image.append(float(np.mean(image_means)))
                evals = [_diff(evaluate, jpeg, 0)[0] for jpeg in jpegs]
                print(f"| {name} | {decoder} | {'tensor' if tensor_ending else 'PIL'} | "
                      f"{full}/{len(means)}; {worst}; {np.mean(means):.2f} "
                      f"({max(per_image):.2f}) | {max(int(d.max()) for d in evals)}; "
                      f"{np.mean([float(d.float().mean()) for d in evals]):.2f} |", flush=True)
    _fused._simplejpeg = simplejpeg


if __name__ == "__main__":
    main()
