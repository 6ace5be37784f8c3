"""What the parts of ``benchmarks/gpu_feed.py`` share: their sizes, the device they run on (CUDA,
or for ``--dry-run`` the fake device of stoker's tests on the CPU), the synthetic JPEG files,
the datasets each loader reads them with, and the clocks (wall and whole-machine CPU time).

Every part runs the same code in both modes; only ``Gpu``'s few methods differ."""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np
import torch
from PIL import Image

import stoker


@dataclass(frozen=True)
class Sizes:
    """How much each part does; ``FULL`` on a GPU machine, ``DRY`` for the dry run."""

    files: int  # unique JPEG files (the loaders read them in turn)
    height: int  # of every JPEG
    width: int
    out: int  # output side of every decode
    batch: int  # images per batch (decode and step)
    cpu_decode_batches: int  # per worker and epoch, decoding on the CPU (a, b)
    gpu_decode_batches: int  # per epoch or bare loop, decoding on the GPU (c, d)
    image_batch: tuple[int, ...]  # the feed's image batch, uint8
    token_batch: tuple[int, ...]  # the feed's token batch, int64
    feed_batches: int  # image batches timed per feed measurement
    token_batches: int  # token batches timed per feed measurement
    steps: int  # training steps timed per loader
    warmup_steps: int  # before timing: workers up, cuDNN's algorithms chosen
    trial_steps: int  # per num_workers candidate when choosing torch's best


FULL = Sizes(files=1024, height=375, width=500, out=224, batch=256, cpu_decode_batches=12,
             gpu_decode_batches=40,
             image_batch=(256, 3, 224, 224), token_batch=(64, 4096), feed_batches=200,
             token_batches=2000,
             steps=200, warmup_steps=10, trial_steps=25)
DRY = Sizes(files=12, height=60, width=80, out=32, batch=4, cpu_decode_batches=2,
            gpu_decode_batches=3,
            image_batch=(4, 3, 32, 32), token_batch=(4, 64), feed_batches=4, token_batches=4,
            steps=3, warmup_steps=1, trial_steps=2)
# stoker's best documented setting: the one switch (NOTE [ Same as torch unless asked ]).
STOKER_BEST: dict[str, Any] = {"persistent_workers": True, "beyond_torch": True}


# ---------------------------------------------------------------------------------------------
# The device: CUDA, or the fake device on the CPU
# ---------------------------------------------------------------------------------------------


class Gpu:
    """CUDA (``dry=False``) or, for the dry run, ``stoker.device.fake.FakeDevice``: stoker's
    loader copies through it (its ``CudaBackend`` replaced, as tests/integration does) and
    ``sync`` runs its queued work; everything else is the CPU."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.fake: Any = None
        if dry:
            import stoker.device.attach as attach
            from stoker.device.fake import FakeDevice

            self.fake = FakeDevice()
            attach.CudaBackend = lambda device: self.fake  # type: ignore[assignment,misc]
            self.device = torch.device("cpu")
        else:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def cuda_started(self) -> None:
        """On the GPU every part has started CUDA by the time it starts a loader's workers, so
        ``beyond_torch``'s ``cuda_forkserver`` starts them with forkserver; the dry run says
        CUDA started too, for the step's loaders only (forkserver starts cost seconds)."""
        if self.dry:
            torch.cuda.is_initialized = lambda: True

    def sync(self) -> None:
        if self.dry:
            self.fake.run()
        else:
            torch.cuda.synchronize()

    def arrived(self, batch: Any) -> None:
        """Before a loop uses a batch: the fake device runs the copies queued so far (on CUDA
        the loop's next kernel waits on the feed's event: nothing to do)."""
        if self.dry:
            self.fake.run()

    def stoker_loader(self, dataset: Any, transform: Any = None, ahead: int = 1,
                      **kwargs: Any) -> stoker.DataLoader:
        """``stoker.DataLoader(dataset, device="cuda", device_transform=transform, ...)``."""
        if not self.dry:
            return stoker.DataLoader(dataset, device=self.device, device_prefetch=ahead,
                                     device_transform=transform, **kwargs)
        from stoker.device.feed import FeedSpec

        loader = stoker.DataLoader(dataset, **kwargs)
        loader._stoker_feed_spec = FeedSpec(torch.device("cpu"), ahead, transform)
        return loader

    def pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(tuple(shape), dtype=dtype, pin_memory=not self.dry)

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    @property
    def pin_memory(self) -> bool:
        """torch's loader: ``pin_memory=True`` on CUDA (on the CPU it only warns)."""
        return not self.dry

    def side_stream(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.dry else torch.cuda.stream(torch.cuda.Stream())

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def decode_jpegs(self) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """torchvision's batched ``decode_jpeg(list, device="cuda")``; the dry run's stand-in
        decodes the same list with Pillow."""
        if self.dry:
            return lambda data: [pillow_rgb(bytes(t.numpy())) for t in data]
        from torchvision.io import ImageReadMode, decode_jpeg

        device = self.device
        return lambda data: decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


# ---------------------------------------------------------------------------------------------
# Synthetic JPEG files (no network on the GPU machine)
# ---------------------------------------------------------------------------------------------


def _one_jpeg(args: tuple[int, int, int, str]) -> str:
    """A photo-like image (smooth colour regions plus grain, so it compresses and decodes like
    a photo, not like noise) saved at quality 90."""
    seed, height, width, path = args
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8)
    smooth = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    grain = rng.integers(-12, 13, size=(height, width, 3), dtype=np.int16)
    pixels = np.clip(np.asarray(smooth, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)
    return path


def make_jpegs(root: str, sizes: Sizes) -> list[str]:
    """``sizes.files`` JPEGs of ``sizes.height x sizes.width`` under ``root``, made on every
    core (forked: call it before CUDA starts)."""
    os.makedirs(root, exist_ok=True)
    jobs = [(k, sizes.height, sizes.width, os.path.join(root, f"img_{k:05d}.jpg"))
            for k in range(sizes.files)]
    with get_context("fork").Pool(min(len(jobs), os.cpu_count() or 1)) as pool:
        return pool.map(_one_jpeg, jobs)


def pillow_rgb(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as im:
        return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)


def read_all(paths: Sequence[str]) -> list[bytes]:
    out = []
    for path in paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


# ---------------------------------------------------------------------------------------------
# The datasets: the same files, one per loader under test (index i reads file i % files)
# ---------------------------------------------------------------------------------------------


class _Files(torch.utils.data.Dataset):
    def __init__(self, paths: Sequence[str], length: int, out: int) -> None:
        self.paths, self.length, self.out = list(paths), length, out

    def __len__(self) -> int:
        return self.length

    def read(self, index: int) -> bytes:
        with open(self.paths[index % len(self.paths)], "rb") as f:
            return f.read()


class PillowCrops(_Files):
    """What a torch user writes: Pillow decode, ``RandomResizedCrop`` + flip, to a uint8 CHW
    tensor, in ``__getitem__`` (torchvision's transforms when installed, else the demo's
    Pillow-only equivalent, which draws torchvision's boxes)."""

    def __init__(self, paths: Sequence[str], length: int, out: int) -> None:
        super().__init__(paths, length, out)
        self.transform: Any = None
        try:
            from torchvision import transforms as T

            self.transform = T.Compose([T.RandomResizedCrop(out), T.RandomHorizontalFlip(),
                                        T.PILToTensor()])
        except ImportError:
            pass

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.paths[index % len(self.paths)]
        if self.transform is None:
            from stoker.doctor.demo_workload import decode_and_augment

            return decode_and_augment(path, self.out), index % 1000
        with Image.open(path) as im:
            return self.transform(im.convert("RGB")), index % 1000


class ImagePathCrops(_Files):
    """The same samples on stoker's image path: one line, ``decode_crop_into``."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from stoker.image import decode_crop_into

        out = torch.empty((3, self.out, self.out), dtype=torch.uint8)
        decode_crop_into(self.read(index), out, stoker.sample_rng())
        return out, index % 1000


class EncodedFiles(_Files):
    """The bytes alone (``DecodeImages`` decodes them on the GPU): the workers only read."""

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return self.read(index), index % 1000


# ---------------------------------------------------------------------------------------------
# Clocks
# ---------------------------------------------------------------------------------------------


def machine_cpu_s() -> float:
    """CPU seconds spent so far by the whole machine (every process: workers, the loop, the
    driver's threads), from /proc/stat; this process and its children where that is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system


@dataclass
class Timed:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    items: int = 0  # images, batches or steps, as the part counts
    cut_short: bool = False  # the part's deadline came first


@contextlib.contextmanager
def timing(gpu: Gpu, result: Timed) -> Iterator[Timed]:
    """Wall and whole-machine CPU time of the block, the device synchronized at both ends."""
    gpu.sync()
    t0, c0 = time.perf_counter(), machine_cpu_s()
    yield result
    gpu.sync()
    result.wall_s, result.cpu_s = time.perf_counter() - t0, machine_cpu_s() - c0


def timed_loop(gpu: Gpu, batches: Iterator[Any], warm: int, deadline: float,
               count: Callable[[Any], int], step: Callable[[Any], None] | None = None) -> Timed:
    """Take ``warm`` batches untimed, then time the rest (or up to ``deadline``): ``count`` says
    how many items a batch holds, ``step`` is the loop's work on it (default: none)."""
    for _ in range(warm):
        batch = next(batches)
        gpu.arrived(batch)
        if step is not None:
            step(batch)
    result = Timed()
    with timing(gpu, result):
        for batch in batches:
            gpu.arrived(batch)
            if step is not None:
                step(batch)
            result.items += count(batch)
            if time.monotonic() > deadline:
                result.cut_short = True
                break
    return result


def second_epoch(gpu: Gpu, loader: Any, deadline: float, count: Callable[[Any], int],
                 step: Callable[[Any], None] | None = None) -> Timed:
    """One untimed epoch (workers start, pools fill), then the second (persistent workers)
    timed from ``iter()`` to its last batch, or to ``deadline``. The first gets at most half
    the time left: a slow machine still times part of the second (``cut_short``)."""
    warm_until = time.monotonic() + (deadline - time.monotonic()) / 2
    cut = False
    for batch in loader:
        gpu.arrived(batch)
        if step is not None:
            step(batch)
        if time.monotonic() > warm_until:
            cut = True
            break
    result = timed_loop(gpu, iter(loader), 0, deadline, count, step)
    result.cut_short = result.cut_short or cut
    return result
