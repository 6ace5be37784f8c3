"""The decode and feed parts of ``benchmarks/gpu_feed.py`` (the step is ``_gpu_step.py``).

Each part is a function of one ``Part``: it measures, and hands each figure to ``part.emit``
as soon as it has it, so a part that fails or runs out of time keeps what it measured."""

from __future__ import annotations

import json
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from _gpu_env import (
    STOKER_BEST,
    EncodedFiles,
    Gpu,
    ImagePathCrops,
    PillowCrops,
    Sizes,
    Timed,
    read_all,
    second_epoch,
    timed_loop,
)

import stoker


@dataclass
class Part:
    """What a part gets: the device, its sizes, the JPEG files, the core count, its deadline
    (``time.monotonic()``), and where its figures go (one JSON line each)."""

    name: str
    gpu: Gpu
    sizes: Sizes
    paths: list[str]
    cores: int
    deadline: float
    lines_path: str
    emitted: dict[str, dict[str, Any]] = field(default_factory=dict)

    def emit(self, figure: str, values: dict[str, Any]) -> None:
        line = {"part": self.name, "figure": figure, **values}
        self.emitted[figure] = values
        with open(self.lines_path, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)

    def attempt(self, figure: str, measure: Callable[[], dict[str, Any]]) -> None:
        """Emit ``measure()``'s values as ``figure``; if it raises, emit the error instead and
        go on with the part's next figure."""
        try:
            values = measure()
        except Exception as exc:
            traceback.print_exc()
            values = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        self.emit(figure, values)

    def until(self, seconds: float) -> float:
        """A deadline ``seconds`` from now, never past the part's own."""
        return min(self.deadline, time.monotonic() + seconds)


def _per_image(r: Timed, **extra: Any) -> dict[str, Any]:
    return {"images_per_s": r.items / r.wall_s if r.wall_s else None,
            "cpu_s_per_image": r.cpu_s / r.items if r.items else None,
            "images": r.items, "wall_s": r.wall_s, "cut_short": r.cut_short, **extra}


def _images(batch: Any) -> int:
    return len(batch[1])


# ---------------------------------------------------------------------------------------------
# Decode, images/s and CPU s per image, the same JPEGs, out x out output
# ---------------------------------------------------------------------------------------------


def decode_torch(part: Part) -> None:
    """(a) torch's DataLoader, Pillow + RandomResizedCrop + flip in ``__getitem__``, a worker
    per core."""
    s, workers = part.sizes, part.cores
    dataset = PillowCrops(part.paths, workers * s.cpu_decode_batches * s.batch, s.out)
    loader = torch.utils.data.DataLoader(dataset, batch_size=s.batch, num_workers=workers,
                                         persistent_workers=True)
    how = "torchvision transforms" if dataset.transform is not None else "Pillow only"
    part.emit("torch_pillow", _per_image(second_epoch(part.gpu, loader, part.deadline, _images),
                                         num_workers=workers, transforms=how))


def decode_stoker(part: Part) -> None:
    """(b) stoker's CPU image path (``decode_crop_into`` in ``__getitem__``), same workers."""
    s, workers = part.sizes, part.cores
    dataset = ImagePathCrops(part.paths, workers * s.cpu_decode_batches * s.batch, s.out)
    loader = stoker.DataLoader(dataset, batch_size=s.batch, num_workers=workers, **STOKER_BEST)
    from stoker.image.decode import _cv2, _simplejpeg

    decoder = ("simplejpeg" if _simplejpeg is not None else "Pillow (no simplejpeg)") + (
        ", OpenCV resize" if _cv2 is not None else ", Pillow resize (no OpenCV)")
    part.emit("stoker_image_path", _per_image(
        second_epoch(part.gpu, loader, part.deadline, _images), num_workers=workers,
        decoder=decoder))


def decode_gpu(part: Part) -> None:
    """(d) torchvision's batched decode in a bare loop (the library's own limit), then
    ``DecodeImages`` bare (decode + crop + resize, no loader), then (c) ``DecodeImages``
    through stoker's loader, its workers only reading the files."""
    from stoker.device import feed
    from stoker.image import DecodeImages

    s, gpu = part.sizes, part.gpu
    jpegs = read_all(part.paths)
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in jpegs]
    n = s.gpu_decode_batches

    def batches(items: list[Any]) -> Any:
        for k in range(n + 2):  # two to warm up
            start = (k * s.batch) % len(items)
            yield [items[(start + j) % len(items)] for j in range(s.batch)]

    part.attempt("torchvision_bare", lambda: _per_image(timed_loop(
        gpu, (gpu.decode_jpegs()(b) for b in batches(tensors)), 2, part.until(20), len),
        batch=s.batch))

    from stoker.image.gpu_decode import _gpu_decoder

    decode = DecodeImages(size=s.out)
    how = {"decoder": "nvJPEG, batched (torchvision)" if _gpu_decoder() else
           "Pillow (no torchvision)"}

    def bare() -> dict[str, Any]:
        feed._BATCH.seed, feed._BATCH.device = 0, gpu.device
        try:
            r = timed_loop(gpu, (decode(b) for b in batches(jpegs)), 2, part.until(20), len)
        finally:
            feed._BATCH.seed = feed._BATCH.device = None
        return _per_image(r, batch=s.batch, **how)

    part.attempt("decode_images_bare", bare)

    def through_loader() -> dict[str, Any]:
        workers = min(4, part.cores)
        loader = gpu.stoker_loader(EncodedFiles(part.paths, n * s.batch, s.out), decode,
                                   batch_size=s.batch, num_workers=workers, **STOKER_BEST)
        r = second_epoch(gpu, loader, part.deadline, lambda b: len(b[0]))
        # Where the loader's time over the bare loop goes: the transform (the decode itself),
        # receiving the bytes from the workers, waiting for them.
        return _per_image(r, num_workers=workers, **how, **_where_the_time_went(loader))

    part.attempt("decode_images_loader", through_loader)


# ---------------------------------------------------------------------------------------------
# Feed: batches/s delivered on the device against a plain pinned-copy loop
# ---------------------------------------------------------------------------------------------


class Batches(torch.utils.data.Dataset):
    """Whole batches (``batch_size=None``): a worker's cost is one copy of the batch."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, count: int) -> None:
        self.count = count
        high = 256 if dtype == torch.uint8 else 50_000
        self.data = torch.randint(0, high, shape, dtype=dtype)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data


def plain_copies(gpu: Gpu, shape: tuple[int, ...], dtype: torch.dtype, n: int,
                 deadline: float) -> Timed:
    """One pre-made pinned batch copied ``n`` times on a side stream, nothing else: the
    host-to-device limit."""
    src, dst = gpu.pinned(shape, dtype), gpu.empty(shape, dtype)
    with gpu.side_stream():
        return timed_loop(gpu, (src for _ in range(n + 3)), 3, deadline, lambda _: 1,
                          lambda b: dst.copy_(b, non_blocking=True))


def _feed_loaders(gpu: Gpu, dataset: Batches, workers: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(batch_size=None, num_workers=workers)
    return {
        # The bound on any feed: host batches (in slabs, as device= gets them), no copy.
        "host_only": lambda: stoker.DataLoader(dataset, persistent_workers=True,
                                               beyond_torch={"slab_transport"}, **kwargs),
        "stoker": lambda: gpu.stoker_loader(dataset, persistent_workers=True, **kwargs),
        "stoker_best": lambda: gpu.stoker_loader(dataset, **STOKER_BEST, **kwargs),
        "torch": lambda: torch.utils.data.DataLoader(
            dataset, pin_memory=gpu.pin_memory, persistent_workers=True, **kwargs),
    }


def feed(part: Part) -> None:
    """Each batch shape: the plain loop, then ``device=`` (defaults, and the one switch) and
    torch's pattern (``pin_memory=True`` + ``.to(device, non_blocking=True)``)."""
    gpu, s = part.gpu, part.sizes
    # All cores but the loop's and the driver's: writing 54 GB/s of batches (the plain loop's
    # rate on an H200) takes most of a 16-core machine (8 workers deliver 0.59 of it, 14 0.94).
    workers = max(1, part.cores - 2)
    shapes = {"image_uint8": (s.image_batch, torch.uint8, s.feed_batches),
              "tokens_int64": (s.token_batch, torch.int64, s.token_batches)}
    for name, (shape, dtype, count) in shapes.items():
        def plain(shape: tuple[int, ...] = shape, dtype: torch.dtype = dtype,
                  count: int = count) -> dict[str, Any]:
            r = plain_copies(gpu, shape, dtype, count, part.until(10))
            return {"batches_per_s": r.items / r.wall_s, "shape": list(shape)}

        part.attempt(f"{name}.plain", plain)
        plain_rate = part.emitted[f"{name}.plain"].get("batches_per_s")

        def alone(shape: tuple[int, ...] = shape, dtype: torch.dtype = dtype,
                  count: int = count, plain_rate: float | None = plain_rate) -> dict[str, Any]:
            touched = torch.zeros((), dtype=dtype, device=gpu.device)
            r = feed_only(gpu, shape, dtype, count, part.until(10),
                          lambda b: touched.add_(b.view(-1)[-1]))
            rate = r.items / r.wall_s if r.wall_s else None
            return {"batches_per_s": rate,
                    "share_of_plain": rate / plain_rate if rate and plain_rate else None}

        part.attempt(f"{name}.feed_only", alone)
        dataset = Batches(shape, dtype, count)
        for kind, make in _feed_loaders(gpu, dataset, workers).items():
            def measure(make: Any = make, kind: str = kind, dtype: torch.dtype = dtype,
                        plain_rate: float | None = plain_rate) -> dict[str, Any]:
                touched = torch.zeros((), dtype=dtype, device=gpu.device)

                def step(batch: torch.Tensor) -> None:
                    if kind == "host_only":
                        return
                    if kind == "torch":
                        batch = batch.to(gpu.device, non_blocking=True)
                    touched.add_(batch.view(-1)[-1])  # a kernel reads the batch, no host sync

                loader = make()
                r = second_epoch(gpu, loader, part.until(15), lambda _: 1, step)
                rate = r.items / r.wall_s if r.wall_s else None
                return {"batches_per_s": rate,
                        "share_of_plain": rate / plain_rate if rate and plain_rate else None,
                        "num_workers": workers, "cut_short": r.cut_short,
                        **_where_the_time_went(loader)}

            part.attempt(f"{name}.{kind}", measure)


class _PremadeHosts:
    """A ``HostSource`` (``stoker.device.feed``) handing out pre-made pinned batches: the feed
    on its own, no workers and no engine."""

    def __init__(self, batches: list[torch.Tensor], count: int) -> None:
        self._batches, self._left = batches, count

    def next_host(self) -> Any:
        if self._left <= 0:
            raise StopIteration
        self._left -= 1
        return self._batches[self._left % len(self._batches)]

    def hold_deliveries(self) -> None:
        pass

    def release_deliveries(self) -> list[Any]:
        return []

    def apply_deliveries(self, deliveries: list[Any]) -> None:
        pass

    def seed_of(self, deliveries: list[Any]) -> int | None:
        return None


def feed_only(gpu: Gpu, shape: tuple[int, ...], dtype: torch.dtype, count: int,
              deadline: float, step: Callable[[Any], None]) -> Timed:
    """``count`` batches through stoker's ``DeviceFeed`` (copies queued ahead on its stream,
    events, ``record_stream``) from three pre-made pinned batches: the feed's own per-batch
    cost against the plain loop, with nothing to receive from workers."""
    from types import SimpleNamespace

    from stoker.device.feed import DeviceFeed, FeedSpec

    stats = SimpleNamespace(measures=False, to_device_s=0.0, device_transform_s=0.0,
                            device_bytes=0, device_batches=0, device_copy_s=0.0,
                            device_wait_s=0.0)
    backend: Any = gpu.fake if gpu.dry else None
    if backend is None:
        from stoker.device.backend import CudaBackend

        backend = CudaBackend(gpu.device)
    batches = [gpu.pinned(shape, dtype) for _ in range(3)]
    device_feed = DeviceFeed(FeedSpec(gpu.device, 1, None), backend,
                             _PremadeHosts(batches, count + 3), stats)

    def handed_out() -> Iterator[Any]:
        while True:
            try:
                yield device_feed.next()
            except StopIteration:
                return

    try:
        return timed_loop(gpu, handed_out(), 3, deadline, lambda _: 1, step)
    finally:
        device_feed.close()


def _where_the_time_went(loader: Any) -> dict[str, Any]:
    """stoker's own account of a loader's run (both epochs): the share of the loop's time spent
    in ``next()``, the part of it queuing copies, and per batch the workers' time (fetch,
    collate, pack) and the training thread's (unpack, device_transform, all of next())."""
    if not isinstance(loader, stoker.DataLoader):
        return {}
    st = loader.stats()
    span = st.wait_s + st.loop_s
    per = max(st.batches, 1)
    return {"wait_share": st.wait_s / span if span else None,
            "to_device_share": st.to_device_s / span if span else None,
            "ms_per_batch": {k: 1e3 * v / per for k, v in (
                ("fetch", st.fetch_wall_s), ("collate", st.collate_s), ("pack", st.pack_s),
                ("unpack", st.unpack_s), ("transform", st.device_transform_s),
                ("wait", st.wait_s))},
            "main_cpu_share": st.main_cpu_s / span if span else None}


def machine(part: Part) -> None:
    """What ran: the device, the core count, the versions (in a part, so the script's own
    process never starts CUDA before it forks)."""
    info: dict[str, Any] = {"cores": part.cores, "torch": torch.__version__,
                            "stoker": getattr(stoker, "__version__", "?"), "dry_run": part.gpu.dry}
    if part.gpu.dry:
        info["device"] = "fake device (stoker.device.fake.FakeDevice) on the CPU"
    else:
        props = torch.cuda.get_device_properties(part.gpu.device)
        info.update(device=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, gpus=torch.cuda.device_count())
    try:
        info["dev_shm_gib"] = round(shutil.disk_usage("/dev/shm").total / 2**30, 1)
    except OSError:
        info["dev_shm_gib"] = None
    for module in ("torchvision", "simplejpeg", "cv2", "PIL", "numpy"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    part.emit("machine", info)


PARTS: dict[str, Callable[[Part], None]] = {
    "machine": machine, "decode_gpu": decode_gpu, "decode_torch": decode_torch,
    "decode_stoker": decode_stoker, "feed": feed,
}
