"""DecodeImages' GPU path without a GPU (issue 46): a stand-in for torchvision's batched
nvJPEG decode shows that a batch's JPEGs go to the decoder in one call (others to Pillow, in
the batch's order), that the batch's crops and resizes are one call with the boxes in the
batch's order, and that the output is the CPU path's for the same batch seed (up to float32
summation order)."""

from __future__ import annotations

import io
import threading

import numpy as np
import torch
from PIL import Image

from stoker.image import gpu_decode
from stoker.image.crops import random_resized_crop_boxes
from stoker.image.gpu_decode import DecodeImages


def encoded(h: int, w: int, fmt: str, seed: int) -> bytes:
    coarse = np.random.default_rng(seed).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(coarse).resize((w, h), Image.BICUBIC).save(buf, format=fmt)
    return buf.getvalue()


def pillow(data: bytes) -> torch.Tensor:
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)


class BatchedStandIn:
    """Called as torchvision's wrapper is: (list of uint8 tensors of encoded bytes, device)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, torch.device]] = []
        self.threads: set[str] = set()

    def __call__(self, data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        self.calls.append((len(data), device))
        self.threads.add(threading.current_thread().name)
        return [pillow(bytes(t.numpy())) for t in data]


ITEMS = [encoded(40, 60, "JPEG", 1), encoded(50, 30, "PNG", 2), encoded(33, 47, "JPEG", 3),
         encoded(64, 64, "JPEG", 4)]


def _decoded(decode: DecodeImages, decoder: BatchedStandIn) -> list[torch.Tensor]:
    chunks = [range(k, min(k + gpu_decode.DECODE_CHUNK, len(ITEMS)))
              for k in range(0, len(ITEMS), gpu_decode.DECODE_CHUNK)]
    return [img for images in decode._decode_gpu(ITEMS, chunks, torch.device("cpu"), decoder)
            for img in images]


def test_the_jpegs_of_a_batch_go_to_the_decoder_in_one_call_the_rest_to_pillow() -> None:
    decoder = BatchedStandIn()
    images = _decoded(DecodeImages(size=16), decoder)
    assert decoder.calls == [(3, torch.device("cpu"))]  # one call, the three JPEGs
    assert decoder.threads == {"stoker-nvjpeg_0"}  # on the decode thread
    assert [tuple(img.shape) for img in images] == [(3, 40, 60), (3, 50, 30), (3, 33, 47),
                                                    (3, 64, 64)]
    assert all(torch.equal(img, pillow(data)) for img, data in zip(images, ITEMS, strict=True))


def test_a_batch_goes_in_chunks_in_order(monkeypatch) -> None:
    """NOTE [ Decoded a chunk ahead ]: one decoder call a chunk (its JPEGs), the images in
    the batch's order, and the same boxes and pixels as the CPU path for one seed."""
    monkeypatch.setattr(gpu_decode, "DECODE_CHUNK", 2)
    decoder = BatchedStandIn()
    decode = DecodeImages(size=16)
    images = _decoded(decode, decoder)
    assert decoder.calls == [(1, torch.device("cpu")), (2, torch.device("cpu"))]
    assert all(torch.equal(img, pillow(data)) for img, data in zip(images, ITEMS, strict=True))
    out = decode._decode_with(ITEMS, np.random.default_rng(4), BatchedStandIn(),
                              torch.device("cpu"))
    cpu = decode._decode_with(ITEMS, np.random.default_rng(4), None, None)
    diff = (out.int() - cpu.int()).abs()
    assert out.shape == (4, 3, 16, 16) and diff.max().item() <= 1


def test_the_batch_is_cropped_and_resized_in_one_call_and_matches_the_cpu_path(
        monkeypatch) -> None:
    calls: list[tuple[list[tuple[int, ...]], list[tuple[int, int, int, int]], int]] = []
    batched = gpu_decode.crop_resize_batch

    def spy(images: list[torch.Tensor], boxes: list, size: int) -> torch.Tensor:
        calls.append(([tuple(i.shape) for i in images], list(boxes), size))
        return batched(images, boxes, size)

    monkeypatch.setattr(gpu_decode, "crop_resize_batch", spy)
    decode = DecodeImages(size=16)
    out = decode._decode_with(ITEMS, np.random.default_rng(9), BatchedStandIn(),
                              torch.device("cpu"))
    shapes = [tuple(pillow(data).shape) for data in ITEMS]
    boxes = random_resized_crop_boxes(np.random.default_rng(9), [s[1:] for s in shapes])
    assert calls == [(shapes, boxes, 16)]  # the whole batch, its boxes in the batch's order
    assert out.shape == (4, 3, 16, 16) and out.dtype == torch.uint8
    cpu = decode._decode_with(ITEMS, np.random.default_rng(9), None, None)
    # The CPU path resizes each crop with F.interpolate: the same weights, float32 sums in
    # another order (NOTE [ A batch resized as two matmuls ]).
    diff = (out.int() - cpu.int()).abs()
    assert diff.max().item() <= 1 and diff.float().mean().item() < 0.01


def test_the_gpu_decoder_is_asked_only_for_a_cuda_batch(monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(gpu_decode, "_gpu_decoder", lambda: asked.append(1))
    from stoker.device import feed

    feed._BATCH.seed, feed._BATCH.device = 3, torch.device("cpu")
    try:
        out = DecodeImages(size=8)(ITEMS)
    finally:
        feed._BATCH.seed = feed._BATCH.device = None
    assert asked == [] and out.shape == (4, 3, 8, 8)
