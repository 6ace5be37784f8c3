"""The step part of ``benchmarks/gpu_feed.py``: ResNet-50 (bf16 autocast, channels_last, SGD)
trained from the JPEG files, each loader's step time as a ratio to the same step on a batch
already resident on the device: torch's DataLoader at its best ``num_workers`` (of a few tried),
stoker's image path, and stoker with the decode on the GPU (``DecodeImages``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _gpu_env import STOKER_BEST, EncodedFiles, Gpu, ImagePathCrops, PillowCrops, timed_loop
from _gpu_parts import Part

_SECONDS = {"resident": 25.0, "trial": 12.0, "loader": 35.0}  # per measurement, at most


def _model(dry: bool) -> tuple[torch.nn.Module, str]:
    if not dry:
        try:
            import torchvision

            return torchvision.models.resnet50(), "torchvision resnet50"
        except ImportError:
            pass
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 7, 2, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, 2, 1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(32, 1000),
    )
    return net, "small conv net" + ("" if dry else " (torchvision not installed)")


def to_float(images: torch.Tensor) -> torch.Tensor:
    return images.float().div_(255).contiguous(memory_format=torch.channels_last)


class FloatImages:
    """``device_transform``: (uint8 images, labels) -> (float channels_last, labels), after
    ``decode`` (``DecodeImages``) when the batch holds encoded images."""

    def __init__(self, decode: Callable[[Any], Any] | None = None) -> None:
        self.decode = decode

    def __call__(self, batch: Any) -> Any:
        images, labels = self.decode(batch) if self.decode is not None else batch
        return to_float(images), labels


class Trainer:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        model, self.model_name = _model(gpu.dry)
        self.model = model.to(gpu.device, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        torch.backends.cudnn.benchmark = True

    def step(self, batch: Any) -> None:
        """One step on (images, labels): uint8 images on any device are moved and converted
        first (the resident batch, torch's loader); float ones came from ``FloatImages``."""
        images, labels = batch
        if images.dtype == torch.uint8:
            images = to_float(images.to(self.gpu.device, non_blocking=True))
        labels = labels.to(self.gpu.device, non_blocking=True)
        with self.gpu.autocast():
            loss = F.cross_entropy(self.model(images), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _timed_steps(part: Part, trainer: Trainer, batches: Any, steps: int,
                 seconds: float) -> dict[str, Any]:
    r = timed_loop(part.gpu, batches, part.sizes.warmup_steps, part.until(seconds),
                   lambda _: 1, trainer.step)
    return {"step_s": r.wall_s / r.items if r.items else None, "steps": r.items,
            "of_steps": steps, "cut_short": r.cut_short}


def step(part: Part) -> None:
    """The resident step, then each loader's; each figure on its own (one that fails is
    recorded with its error, and the next loader still runs)."""
    gpu, s = part.gpu, part.sizes
    gpu.cuda_started()
    trainer = Trainer(gpu)
    shape = (s.batch, 3, s.out, s.out)
    resident = (torch.randint(0, 256, shape, dtype=torch.uint8, device=gpu.device),
                torch.randint(0, 1000, (s.batch,), device=gpu.device))
    n = s.warmup_steps + s.steps
    part.attempt("resident", lambda: {
        **_timed_steps(part, trainer, (resident for _ in range(n)), s.steps,
                       _SECONDS["resident"]), "model": trainer.model_name, "batch": s.batch})
    resident_s = part.emitted["resident"].get("step_s")

    def ratio(figures: dict[str, Any], started: float) -> dict[str, Any]:
        step_s = figures["step_s"]
        return {**figures, "seconds": time.monotonic() - started,
                "ratio_to_resident": step_s / resident_s if step_s and resident_s else None}

    def torch_loader() -> dict[str, Any]:
        started = time.monotonic()
        return ratio(_torch_steps(part, trainer), started)

    part.attempt("torch", torch_loader)

    from stoker.image import DecodeImages

    setups = {
        "stoker_image_path": (ImagePathCrops, FloatImages(), part.cores),
        "stoker_gpu_decode": (EncodedFiles, FloatImages(DecodeImages(size=s.out)),
                              min(4, part.cores)),
    }
    for name, (dataset_type, transform, workers) in setups.items():
        def measure(dataset_type: Any = dataset_type, transform: Any = transform,
                    workers: int = workers) -> dict[str, Any]:
            started = time.monotonic()
            loader = gpu.stoker_loader(dataset_type(part.paths, n * s.batch, s.out),
                                       transform, batch_size=s.batch, shuffle=True,
                                       num_workers=workers, **STOKER_BEST)
            figures = _timed_steps(part, trainer, iter(loader), s.steps, _SECONDS["loader"])
            stats = loader.stats()
            return ratio({**figures, "num_workers": workers,
                          "wait_share": stats.as_dict().get("wait_share"),
                          "stats": str(stats)[:600]}, started)

        part.attempt(name, measure)


def _torch_steps(part: Part, trainer: Trainer) -> dict[str, Any]:
    """torch's DataLoader at the best of a few ``num_workers`` (a short trial each), then
    ``steps`` steps at that."""
    s, gpu = part.sizes, part.gpu

    def loader(workers: int, steps: int) -> Any:
        dataset = PillowCrops(part.paths, (s.warmup_steps + steps) * s.batch, s.out)
        return torch.utils.data.DataLoader(dataset, batch_size=s.batch, num_workers=workers,
                                           pin_memory=gpu.pin_memory, shuffle=True)

    tried = {}
    for workers in sorted({max(1, part.cores // 2), part.cores}):
        trial = _timed_steps(part, trainer, iter(loader(workers, s.trial_steps)),
                             s.trial_steps, _SECONDS["trial"])
        tried[workers] = trial["step_s"] or float("inf")
    best = min(tried, key=lambda w: tried[w])
    figures = _timed_steps(part, trainer, iter(loader(best, s.steps)), s.steps,
                           _SECONDS["loader"])
    return {**figures, "num_workers": best, "tried_step_s": {str(w): v for w, v in tried.items()}}
