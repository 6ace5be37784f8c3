"""stoker's own formats for the differential fuzzer: tar shards read by ``TarShards`` (map
style), built from a ``FormatDS`` spec (``_fuzz_spec``), loaded by torch's DataLoader and by
stoker's on the same files.

A sample is a dict of its members' bytes (with ``__key__`` and ``__url__``), or what a
transform makes of it: an int label, the bytes as a uint8 tensor, a JPEG through
``stoker.vision``'s fused ``Compose`` (drawing from torch's RNG in the worker), or a
``ValueError`` at one sample. Whatever stoker does faster for its own formats must give torch's
batches, draws and errors for them.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from typing import Any

import torch
from _fuzz_spec import FormatDS
from hypothesis import strategies as st

_EXTS = ("cls", "txt", "bin", "jpg")


@st.composite
def format_datasets(draw: Any, n: int, errors: bool, draws: bool) -> FormatDS:
    """With ``errors``, a transform may raise; with ``draws``, it may draw from torch's RNG
    (not where the worker that builds a sample is timing: ``Plan.stable_only``)."""
    exts = ["cls", *draw(st.lists(st.sampled_from(_EXTS[1:]), max_size=2, unique=True))]
    transforms: list[str | None] = [None, "label", "tensor"]
    if "jpg" in exts and draws:
        transforms.append("vision")
    if errors and n:
        transforms.append("fault")
    transform = draw(st.sampled_from(transforms))
    fault_at = draw(st.integers(0, n - 1)) if transform == "fault" else -1
    shards = draw(st.integers(1, max(1, min(3, n))))
    return FormatDS(n, shards, tuple(exts), transform, fault_at)


def _jpeg(i: int) -> bytes:
    from PIL import Image

    y = torch.arange(24 * 32, dtype=torch.int64).view(24, 32)
    pixels = torch.stack([(y * (i + 1)) % 256, (y * 3 + i) % 256, y % 199], -1).to(torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, "JPEG", quality=80)
    return out.getvalue()


def _member(ext: str, i: int) -> bytes:
    if ext == "cls":
        return str(i).encode()
    if ext == "txt":
        return f"sample {i}".encode() * (i % 3)
    if ext == "bin":
        return bytes(range(i % 7, i % 7 + 5 * (i % 4)))
    return _jpeg(i)


def _shards(spec: FormatDS) -> list[str]:
    """The spec's tar files, written once per spec (both loaders read the same files)."""
    name = hashlib.sha256(repr(spec).encode()).hexdigest()[:16]
    root = os.path.join(tempfile.gettempdir(), "stoker-fuzz-formats", name)
    paths = [os.path.join(root, f"s-{k:06d}.tar") for k in range(spec.shards)]
    if all(os.path.exists(p) for p in paths):
        return paths
    os.makedirs(root, exist_ok=True)
    per = -(-spec.n // spec.shards) if spec.n else 0
    for k, path in enumerate(paths):
        partial = f"{path}.{os.getpid()}.part"
        with tarfile.open(partial, "w") as tar:
            for i in range(k * per, min(spec.n, (k + 1) * per)):
                for ext in spec.exts:
                    data = _member(ext, i)
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        os.replace(partial, path)
    return paths


class Transform:
    """The sample transform a spec names (a class: it pickles into spawned workers)."""

    def __init__(self, kind: str | None, fault_at: int) -> None:
        self.kind, self.fault_at = kind, fault_at
        self.compose: Any = None
        if kind == "vision":
            from stoker.vision import transforms as T

            self.compose = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(),
                                      T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))])

    def __call__(self, sample: dict[str, Any]) -> Any:
        label = int(sample["cls"])
        if self.kind == "label":
            return label
        if self.kind == "tensor":  # 64 bytes whatever the members: one shape in a batch
            data = b"".join(v for k, v in sorted(sample.items()) if isinstance(v, bytes))
            fixed = bytearray(data[:64].ljust(64, b"\0"))
            return torch.frombuffer(fixed, dtype=torch.uint8), label
        if self.kind == "vision":
            return self.compose(sample["jpg"]), label
        if label == self.fault_at:
            raise ValueError(f"fault at sample {label}")
        return sample


def build_format_ds(spec: FormatDS) -> Any:
    from stoker.formats import TarShards

    transform = None if spec.transform is None else Transform(spec.transform, spec.fault_at)
    if spec.n == 0:
        return _Empty()
    ds = TarShards(_shards(spec), transform=transform)
    ds.tables = {}  # no arrays of its own to alias (the record's check)
    return ds


class _Empty(torch.utils.data.Dataset):
    """A pack of no samples (no tar can hold none): an empty map-style dataset."""

    tables: dict[int, Any] = {}

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)
