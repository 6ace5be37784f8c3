"""GPU feed benchmarks (issue 14): run where CUDA exists; elsewhere they print why and exit 0.

    python benchmarks/gpu_feed.py [--quick] [--only h2d train decode] [--workers N]

1. ``h2d``: host-to-device throughput of delivered 256x3x224x224 uint8 batches, as a fraction
   of a plain loop of pinned ``cudaMemcpyAsync`` (``copy_(non_blocking=True)`` from one pinned
   buffer), for stoker (``device="cuda"``) and torch's pattern (``pin_memory=True`` +
   ``.to(device, non_blocking=True)``). Goal: stoker >= 0.9 of the plain loop, above torch.
2. ``train``: a training step (torchvision's ResNet-50 if installed, else a small conv net;
   bf16 autocast, SGD) fed by each loader vs the same step on a batch already resident on the
   GPU. Goal: stoker <= 1.05x the resident step time; torch's gap printed beside it.
3. ``decode``: ``DecodeImages`` on the GPU (nvJPEG) vs the CPU (Pillow on every core):
   images/s and CPU seconds per image.

Each record is one JSON line; ratios at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch

import stoker

BATCH_SHAPE = (256, 3, 224, 224)


class Batches(torch.utils.data.Dataset):
    """Whole uint8 batches (batch_size=None): the workers' cost is one memcpy per batch."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.data = torch.randint(0, 256, BATCH_SHAPE, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data


def emit(record: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(record), flush=True)
    return record


def plain_copy_loop(n: int) -> float:
    """Bytes/s of pinned -> device copies on a side stream, nothing else."""
    src = torch.empty(BATCH_SHAPE, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(BATCH_SHAPE, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            dst.copy_(src, non_blocking=True)
        stream.synchronize()
    return n * src.numel() / (time.perf_counter() - t0)


def loader_throughput(kind: str, n: int, workers: int) -> float:
    """Bytes/s of batches delivered on the device by one loader (one warm-up epoch first)."""
    kwargs: dict[str, Any] = dict(batch_size=None, num_workers=workers, persistent_workers=True)
    if kind == "stoker":
        loader: Any = stoker.DataLoader(Batches(n), device="cuda", **kwargs)
    else:
        loader = torch.utils.data.DataLoader(Batches(n), pin_memory=True, **kwargs)
    for _ in range(2):  # the first warms the workers up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0
        touched = torch.zeros((), dtype=torch.int64, device="cuda")
        for batch in loader:
            if kind == "torch":
                batch = batch.to("cuda", non_blocking=True)
            touched += batch[-1, -1, -1, -1]  # a kernel that reads the batch, no host sync
            total += batch.numel()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    return total / elapsed


def bench_h2d(quick: bool, workers: int) -> list[dict[str, Any]]:
    n = 20 if quick else 100
    plain = plain_copy_loop(n)
    out = [emit({"workload": "h2d", "loader": "plain_pinned_copy", "bytes_per_s": plain})]
    for kind in ("torch", "stoker"):
        rate = loader_throughput(kind, n, workers)
        out.append(emit({"workload": "h2d", "loader": kind, "bytes_per_s": rate,
                         "fraction_of_plain": rate / plain, "num_workers": workers}))
    return out


def _model() -> tuple[torch.nn.Module, str]:
    try:
        import torchvision

        return torchvision.models.resnet50(), "torchvision resnet50"
    except ImportError:
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, 2, 1),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(128, 1000),
        )
        return net, "small conv net (torchvision not installed)"


def to_float(batch: torch.Tensor) -> torch.Tensor:
    return batch.float().div_(255).contiguous(memory_format=torch.channels_last)


def bench_train(quick: bool, workers: int) -> list[dict[str, Any]]:
    model, name = _model()
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    labels = torch.randint(0, 1000, (BATCH_SHAPE[0],), device="cuda")

    def step(x: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    n = 10 if quick else 40
    resident = to_float(Batches(1).data.cuda())
    for _ in range(3):
        step(resident)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step(resident)
    torch.cuda.synchronize()
    resident_s = (time.perf_counter() - t0) / n
    out = [emit({"workload": "train", "model": name, "loader": "resident",
                 "step_s": resident_s})]
    for kind in ("torch", "stoker"):
        kwargs: dict[str, Any] = dict(batch_size=None, num_workers=workers,
                                      persistent_workers=True)
        if kind == "stoker":
            loader: Any = stoker.DataLoader(Batches(n), device="cuda",
                                            device_transform=to_float, **kwargs)
        else:
            loader = torch.utils.data.DataLoader(Batches(n), pin_memory=True, **kwargs)
        for _ in range(2):  # the first warms workers and cuDNN up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for x in loader:
                step(x if kind == "stoker" else to_float(x.to("cuda", non_blocking=True)))
            torch.cuda.synchronize()
        step_s = (time.perf_counter() - t0) / n
        extra = {"stats": str(loader.stats())} if kind == "stoker" else {}
        out.append(emit({"workload": "train", "model": name, "loader": kind, "step_s": step_s,
                         "ratio_to_resident": step_s / resident_s, **extra}))
    return out


def _jpegs(count: int) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        pixels = rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def bench_decode(quick: bool) -> list[dict[str, Any]]:
    from stoker.device import feed
    from stoker.image import DecodeImages

    jpegs = _jpegs(64 if quick else 256)
    out = []
    for decode_on in ("cpu", "cuda"):
        try:
            decode = DecodeImages(size=224, decode_on=decode_on)
        except RuntimeError as exc:
            out.append(emit({"workload": "decode", "decode_on": decode_on, "skipped": str(exc)}))
            continue
        feed._BATCH.seed, feed._BATCH.device = 0, torch.device("cuda", 0)
        try:
            decode(jpegs[:8])  # warm-up: pool, nvJPEG handles
            torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            for start in range(0, len(jpegs), 64):
                decode(jpegs[start:start + 64])
            torch.cuda.synchronize()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            feed._BATCH.seed = feed._BATCH.device = None
        out.append(emit({"workload": "decode", "decode_on": decode_on,
                         "images_per_s": len(jpegs) / wall, "cpu_s_per_image": cpu / len(jpegs),
                         "cores": os.cpu_count()}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=["h2d", "train", "decode"])
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        reason = (f"skipped: CUDA is not available (torch {torch.__version__}); these "
                  "benchmarks measure host-to-device copies and GPU decoding")
        print(f"# {reason}")
        emit({"workload": "gpu_feed", "skipped": reason})
        return 0
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; stoker from "
          f"{stoker.__file__}", flush=True)
    records: list[dict[str, Any]] = []
    if "h2d" in args.only:
        records += bench_h2d(args.quick, args.workers)
    if "train" in args.only:
        records += bench_train(args.quick, args.workers)
    if "decode" in args.only:
        records += bench_decode(args.quick)
    for r in records:
        if "fraction_of_plain" in r or "ratio_to_resident" in r:
            value = r.get("fraction_of_plain", r.get("ratio_to_resident"))
            print(f"# {r['workload']:6} {r['loader']:7} {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
