"""What changing ``from torchvision import datasets, transforms`` to ``from stoker.vision
import datasets, transforms`` would buy a loader, measured on its own files.

``loader.stats()`` (on an input-bound loader) and ``stoker doctor`` (on a decode-bound one)
name the import with this gain. A dataset is recognised when it is torchvision's (or
``stoker.vision``'s, with fusion off) ``ImageFolder`` / ``DatasetFolder`` with the default
loader and a ``Compose`` of the transforms ``stoker.vision`` has, starting with the crop or
resize it fuses. Up to 16 of its files (spread over ``samples``) go through the user's own
transform on the loader's decode, and through the same list rebuilt from ``stoker.vision``,
alternating, on one core, for about half a second; torch's RNG state is put back after.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from stoker._core.alternating_timing import alternating_ms
from stoker.vision._io import JPEG_START

_MODULES = ("torchvision.", "stoker.vision.")
_MAX_FILES = 16
IMPORT = ("from torchvision import datasets, transforms  ->  "
          "from stoker.vision import datasets, transforms")


@dataclass(frozen=True)
class ImportGain:
    """The loader's own transform against stoker.vision's fused one, per image, one core."""

    images: int
    as_written_ms: float
    fused_ms: float

    @property
    def ratio(self) -> float:
        return self.as_written_ms / self.fused_ms if self.fused_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}

    def advice(self) -> str:
        return (f"the images are decoded and cropped by torchvision's transforms; change "
                f"`from torchvision import datasets, transforms` to `from stoker.vision import "
                f"datasets, transforms` (the same crops and flips from the same seeds, "
                f"docs/vision.md): on {self.images} of this loader's own files each image was "
                f"{self.ratio:.2f}x faster to prepare ({self.as_written_ms:.2f} -> "
                f"{self.fused_ms:.2f} ms, one core)")


def _ours(obj: Any) -> bool:
    return type(obj).__module__.startswith(_MODULES)


def fused_equivalent(transform: Any) -> Any | None:
    """``transform`` (torchvision's ``Compose``, or stoker.vision's with fusion off) as a
    ``stoker.vision`` ``Compose`` that fuses, or None when it has a transform stoker.vision
    does not have, or does not start with one it fuses."""
    from stoker.vision import transforms as T

    if not _ours(transform) or type(transform).__name__ != "Compose":
        return None
    if isinstance(transform, T.Compose) and transform.fuse:
        return None  # already fused (or turned off by the environment: deliberately)
    rebuilt = []
    for t in getattr(transform, "transforms", ()):
        ours = _rebuild(t, T)
        if ours is None:
            return None
        rebuilt.append(ours)
    compose = T.Compose(rebuilt)
    return compose if compose.fused_plan() is not None else None


def _rebuild(t: Any, T: Any) -> Any | None:
    """One torchvision transform as stoker.vision's, with the same parameters."""
    if not _ours(t):
        return None
    name = type(t).__name__
    if type(t).__module__.startswith("stoker.vision."):
        return t if type(t) is getattr(T, name, None) else None
    mode = getattr(t, "interpolation", None)
    mode = None if mode is None else T.InterpolationMode(mode.value)
    try:
        if name == "RandomResizedCrop":
            return T.RandomResizedCrop(t.size, t.scale, t.ratio, mode, t.antialias)
        if name == "Resize":
            return T.Resize(t.size, mode, t.max_size, t.antialias)
        if name == "CenterCrop":
            return T.CenterCrop(t.size)
        if name == "RandomHorizontalFlip":
            return T.RandomHorizontalFlip(t.p)
        if name in ("ToTensor", "PILToTensor"):
            return getattr(T, name)()
        if name == "Normalize":
            return T.Normalize(t.mean, t.std, t.inplace)
        if name == "ConvertImageDtype":
            return T.ConvertImageDtype(t.dtype)
    except (AttributeError, TypeError, ValueError):
        return None
    return None


def _default_loader(load: Any) -> bool:
    """Whether ``load`` (a folder dataset's ``loader``) is torchvision's (or stoker.vision's)
    Pillow loader."""
    return getattr(load, "__name__", "") in ("default_loader", "pil_loader") and (
        getattr(load, "__module__", "") or "").startswith(_MODULES)


def recognise(dataset: Any) -> tuple[list[str], Any] | None:
    """(up to 16 JPEG paths, the fused ``Compose``) for a folder dataset on torchvision's
    pipeline, else None."""
    samples = getattr(dataset, "samples", None)
    if not _ours(dataset) or not _default_loader(getattr(dataset, "loader", None)):
        return None
    if not isinstance(samples, list) or not samples:
        return None
    fused = fused_equivalent(getattr(dataset, "transform", None))
    if fused is None:
        return None
    step = max(1, len(samples) // _MAX_FILES)
    paths: list[str] = []
    for item in samples[::step][:_MAX_FILES]:
        path = item[0] if isinstance(item, tuple) and item else None
        if not isinstance(path, str):
            continue
        try:
            with open(path, "rb") as f:
                if f.read(3) == JPEG_START:
                    paths.append(path)
        except (OSError, TypeError):
            continue
    return (paths, fused) if paths else None


def measure(dataset: Any, budget_s: float = 0.5) -> ImportGain | None:
    """The gain on the dataset's own files, or None when it is not recognised."""
    found = recognise(dataset)
    if found is None:
        return None
    paths, fused = found
    as_written, load = dataset.transform, dataset.loader
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        as_written_ms, fused_ms = alternating_ms(
            paths, lambda _, path: as_written(load(path)), lambda _, path: fused(path), budget_s)
    except Exception:  # a transform that fails here is not this measure's to report
        return None
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(state)
    return ImportGain(len(paths), as_written_ms, fused_ms)
