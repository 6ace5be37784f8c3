"""``DecodeImages``: a batch of encoded images decoded, cropped and resized in one call, on the
GPU (nvJPEG through torchvision) when it can, else on the CPU (Pillow) with the same output.

Use it as ``device_transform`` with a dataset that returns encoded bytes: the workers only read
files (cheap), and the batch's JPEGs are decoded on the GPU right after the copy, on the copy
stream. Every leaf of the batch that is a list or tuple of ``bytes`` (what ``default_collate``
makes of them) becomes one ``uint8`` tensor ``N x 3 x size x size``; the rest passes through.

Crop boxes are torchvision's ``RandomResizedCrop`` distribution (the batch's at once,
``stoker.image.crops.random_resized_crop_boxes``), drawn from a generator seeded by the batch's
per-batch seed (base seed, epoch, position), so they do not depend on ``num_workers`` and come
out the same after a resume. Resizing is torch's antialiased bilinear interpolation on both paths
(in float32, rounded back to uint8; on the GPU the whole batch's crops in two matmuls with the
same weights, NOTE [ A batch resized as two matmuls ]), so the two paths differ by their JPEG
decoders' rounding and, by at most a grey level, the order of float32 sums.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from stoker.device.feed import current_batch_device, current_batch_seed
from stoker.device.tree import map_batch
from stoker.image.crops import random_resized_crop_boxes
from stoker.image.resample import Box, crop_resize_batch

Crop = Literal["random_resized", "center", "none"]
DecodeOn = Literal["auto", "cuda", "cpu"]
_CROPS = ("random_resized", "center", "none")
_JPEG_MAGIC = b"\xff\xd8"

# NOTE [ Decoded a chunk ahead ]
# torchvision's batched nvJPEG decode spends most of its time on one CPU thread (Huffman
# decoding), with the GIL released; what DecodeImages adds (staging the bytes, drawing boxes,
# queuing the resize) is Python on the calling thread. Run one after the other, the two added
# up (H200: torchvision alone 24,900 images/s, DecodeImages 13,000). So a batch goes in chunks
# of ``DECODE_CHUNK``: every chunk's decode is queued at once on one decode thread (one: the
# library keeps one decoder behind a lock), on the caller's CUDA stream, and the caller crops
# and resizes chunk k while chunk k + 1 decodes. Boxes are drawn a chunk at a time on both
# paths (GPU and CPU), in the batch's order, so both give the same boxes for one seed.
DECODE_CHUNK = 64


BatchDecoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def _gpu_decoder() -> BatchDecoder | None:
    """torchvision's nvJPEG decode of a whole list in one call (``decode_jpeg(list,
    device=...)``: its batched decode), as RGB; None without torchvision."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None

    def decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))

    return decode


def _is_encoded_batch(x: Any) -> bool:
    # default_collate leaves a batch of bytes as a list, or a tuple when samples are tuples
    return isinstance(x, (list, tuple)) and bool(x) and all(
        isinstance(v, (bytes, bytearray, memoryview)) for v in x
    )


class DecodeImages:
    """Decode + crop + resize every list of encoded images in a batch (see the module doc).

    size: output side (square) in pixels. crop: ``"random_resized"`` (torchvision's
    distribution, with ``scale`` and ``ratio``), ``"center"`` (the largest centered square) or
    ``"none"`` (the whole image, squashed). decode_on: ``"auto"`` (GPU with torchvision and CUDA,
    else CPU), ``"cuda"`` (fails without them) or ``"cpu"``.
    """

    def __init__(
        self, size: int = 224, crop: Crop = "random_resized",
        scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
        decode_on: DecodeOn = "auto",
    ) -> None:
        if crop not in _CROPS:
            raise ValueError(f"DecodeImages(crop={crop!r}): expected one of {_CROPS}.")
        self.size, self.crop, self.scale, self.ratio = size, crop, scale, ratio
        self.decode_on = decode_on
        if decode_on == "cuda" and (_gpu_decoder() is None or not torch.cuda.is_available()):
            raise RuntimeError(
                "DecodeImages(decode_on='cuda') needs torchvision (pip install "
                "'stoker[gpu-decode]', matching your torch build) and a CUDA device; use "
                "decode_on='auto' to fall back to Pillow on the CPU."
            )
        self._pool: ThreadPoolExecutor | None = None
        self._decoding: ThreadPoolExecutor | None = None  # NOTE [ Decoded a chunk ahead ]
        self._pools_pid = os.getpid()
        self._local = threading.local()  # each thread's staging buffer (``_staging``)

    def __call__(self, batch: Any) -> Any:
        seed = current_batch_seed()
        rng = np.random.default_rng(seed if seed is not None else np.random.randint(2**31))
        return map_batch(batch, lambda items: self._decode(items, rng), _is_encoded_batch)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_pool", "_decoding", "_local")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _pool=None, _decoding=None, _local=threading.local(),
                             _pools_pid=os.getpid())

    # -- one list of encoded images --------------------------------------------------------

    def _decode(self, items: Sequence[bytes], rng: np.random.Generator) -> torch.Tensor:
        device = current_batch_device()
        on_gpu = self.decode_on != "cpu" and device is not None and device.type == "cuda"
        return self._decode_with(items, rng, _gpu_decoder() if on_gpu else None, device)

    def _decode_with(self, items: Sequence[bytes], rng: np.random.Generator,
                     decoder: BatchDecoder | None, device: torch.device | None) -> torch.Tensor:
        """Decode with ``decoder`` (batched, on ``device``) or, when None, Pillow on the
        thread pool; crop, resize; the batch on ``device``. See NOTE [ Decoded a chunk
        ahead ]."""
        chunks = [range(k, min(k + DECODE_CHUNK, len(items)))
                  for k in range(0, len(items), DECODE_CHUNK)]
        outs: list[torch.Tensor] = []
        if decoder is not None and device is not None:
            for images in self._decode_gpu(items, chunks, device, decoder):
                # A chunk's crops and resizes in two matmuls (NOTE [ A batch resized as two
                # matmuls ]), not three kernels an image.
                outs.append(crop_resize_batch(images, self._boxes(images, rng), self.size))
        else:
            decoded = self._decode_cpu(items)
            for chunk in chunks:
                images = decoded[chunk.start:chunk.stop]
                # On the CPU an image's cost is its crop's area: each cropped, then resized.
                outs.extend(self._crop_resize(img, box)
                            for img, box in zip(images, self._boxes(images, rng), strict=True))
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        out = out.round_().clamp_(0, 255).to(torch.uint8)
        if device is not None and out.device != device:
            out = out.to(device, non_blocking=True)
        return out

    def _decode_gpu(self, items: Sequence[bytes], chunks: list[range], device: torch.device,
                    decoder: BatchDecoder) -> Iterator[list[torch.Tensor]]:
        """Each chunk's images, in order: its JPEGs in one batched call of ``decoder`` on the
        decode thread, a chunk ahead of the caller; the rest (PNG & co) with Pillow, copied
        to ``device``. NOTE [ Decoded a chunk ahead ]."""
        self._forked_check()
        is_jpeg = [bytes(b[:2]) == _JPEG_MAGIC for b in items]
        staging = self._staging(sum(len(b) for b, j in zip(items, is_jpeg, strict=True) if j))
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        if self._decoding is None:
            self._decoding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stoker-nvjpeg")
        queued: list[tuple[range, list[int], Future[list[torch.Tensor]] | None]] = []
        offset = 0
        try:
            for chunk in chunks:
                jpegs = [i for i in chunk if is_jpeg[i]]
                data, offset = _stage(staging, offset, [items[i] for i in jpegs])
                queued.append((chunk, jpegs, self._decoding.submit(
                    _decode_on, stream, decoder, data, device) if data else None))
            for chunk, jpegs, future in queued:
                images: dict[int, torch.Tensor] = dict(zip(
                    jpegs, future.result() if future is not None else [], strict=True))
                others = [i for i in chunk if i not in images]
                for i, img in zip(others, self._decode_cpu([items[i] for i in others]),
                                  strict=True):
                    images[i] = img.to(device, non_blocking=True)
                yield [images[i] for i in chunk]
        finally:
            # Decodes still reading the staging buffer end before it can be written again.
            for _, _, future in queued:
                if future is not None:
                    wait([future])

    def _forked_check(self) -> None:
        """In a process forked after this object's pools started (a worker using it in
        ``__getitem__``), their threads did not come along: a pool would queue work that never
        runs. Start new ones there."""
        if self._pools_pid != os.getpid():
            self._pool = self._decoding = None
            self._local = threading.local()
            self._pools_pid = os.getpid()

    def _staging(self, nbytes: int) -> torch.Tensor:
        """This thread's staging buffer, at least ``nbytes``: encoded bytes are copied into
        it (``_stage``) rather than into a fresh ``bytearray`` an image, which costs a page
        fault every 4 KiB (more than the copy); ``torch.frombuffer`` of ``bytes`` would warn
        (read-only). It is pageable: a CUDA decode has read its input when it returns."""
        buffer = getattr(self._local, "staging", None)
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._local.staging = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8)
        return buffer

    def _decode_cpu(self, items: Sequence[bytes]) -> list[torch.Tensor]:
        self._forked_check()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                            thread_name_prefix="stoker-decode")
        return list(self._pool.map(_pillow_decode, items))

    def _boxes(self, images: Sequence[torch.Tensor], rng: np.random.Generator) -> list[Box]:
        """Each image's ``(top, left, height, width)`` crop, in the batch's order."""
        sizes = [(int(img.shape[1]), int(img.shape[2])) for img in images]
        if self.crop == "random_resized":
            return random_resized_crop_boxes(rng, sizes, self.scale, self.ratio)
        if self.crop == "center":
            return [((h - min(h, w)) // 2, (w - min(h, w)) // 2, min(h, w), min(h, w))
                    for h, w in sizes]
        return [(0, 0, h, w) for h, w in sizes]

    def _crop_resize(self, img: torch.Tensor, box: Box) -> torch.Tensor:
        top, left, h, w = box
        patch = img[None, :, top:top + h, left:left + w].float()  # the crop alone, then resized
        return F.interpolate(patch, size=(self.size, self.size), mode="bilinear",
                             align_corners=False, antialias=True)


def _stage(buffer: torch.Tensor, offset: int,
           items: Sequence[bytes]) -> tuple[list[torch.Tensor], int]:
    """``items`` copied into ``buffer`` from ``offset`` on: their views, and the next offset."""
    flat = buffer.numpy()
    views = []
    for b in items:
        flat[offset:offset + len(b)] = np.frombuffer(b, dtype=np.uint8)
        views.append(buffer[offset:offset + len(b)])
        offset += len(b)
    return views, offset


def _decode_on(stream: Any, decoder: BatchDecoder, data: list[torch.Tensor],
               device: torch.device) -> list[torch.Tensor]:
    """On the decode thread, on the caller's stream (a thread starts on the default one), so
    the caller's later kernels on that stream see the decoded images."""
    if stream is None:
        return decoder(data, device)
    with torch.cuda.stream(stream):
        return decoder(data, device)


def _pillow_decode(data: bytes) -> torch.Tensor:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "DecodeImages decodes on the CPU with Pillow, which is not installed: "
            "pip install 'stoker[image]' (or install torchvision for GPU decoding)."
        ) from None
    with Image.open(io.BytesIO(data)) as im:
        rgb = np.asarray(im.convert("RGB"))
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)
