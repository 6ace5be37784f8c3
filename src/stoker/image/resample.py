"""Crop + antialiased bilinear resize of a whole batch of images in two matrix products.

NOTE [ A batch resized as two matmuls ]
``F.interpolate(mode="bilinear", antialias=True)`` is separable: each output row is a weighted
sum of input rows, each output column of input columns, with torch's weights (a triangle filter
stretched by the scale, cut at the image's edge and normalised; ``aa_weights``). A crop only
moves and narrows the window the weights cover. So for a batch of images of any sizes, padded
into one ``N x C x H x W`` tensor, the crops and resizes of all of them are

    out[n] = rows[n] @ image[n] @ cols[n].T     (rows: N x S x H, cols: N x S x W)

two batched matmuls, instead of a crop, a cast and an interpolate per image: on a GPU the
per-image way is bound by kernel launches (about 70 µs an image, 18 ms a batch of 256 on an
H200), the matrix way by arithmetic (about 130 GFLOP for 256 images of 500x375, a few ms).
Zero padding is harmless: the weights of a pixel outside an image's crop are zero.

Against ``F.interpolate`` on the cropped image the result differs only in the order float32
sums are taken: at most one grey level after rounding, on a few pixels
(tests/unit/test_resample.py). Where the training script allows TF32 matmuls
(``torch.backends.cuda.matmul.fp32_precision = "tf32"``, or ``set_float32_matmul_precision``
"high"), the products round the weights to 10 bits: up to about a quarter of a grey level more,
well inside the decoders' own rounding. stoker leaves that process-wide setting alone (changing
it for two products would change it for every thread, and mixing torch's two ways of setting
it raises).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Box = tuple[int, int, int, int]  # top, left, height, width
_CHUNK_BYTES = 1 << 30  # float32 images resized at once, at most (a large batch goes in parts)


def aa_weights(start: torch.Tensor, length: torch.Tensor, out: int, full: int) -> torch.Tensor:
    """``N x out x full``: row ``n`` maps ``full`` input pixels to ``out`` outputs, resizing the
    span ``start[n] : start[n] + length[n]`` as torch's antialiased bilinear interpolation does
    (``_compute_weights_aa`` in ATen's UpSample.h: scale = length / out, support =
    max(scale, 1), window [trunc(c - support + .5), trunc(c + support + .5)) clipped to the span,
    weights 1 - |(j - c + .5) / max(scale, 1)| normalised)."""
    dev = start.device
    scale = (length.to(torch.float32) / out)[:, None, None]
    support = scale.clamp(min=1.0)
    center = scale * (torch.arange(out, device=dev, dtype=torch.float32) + 0.5)[None, :, None]
    low = torch.trunc(center - support + 0.5).clamp(min=0)
    high = torch.minimum(torch.trunc(center + support + 0.5),
                         length.to(torch.float32)[:, None, None])
    j = torch.arange(full, device=dev, dtype=torch.float32)[None, None, :] - start.to(
        torch.float32)[:, None, None]  # each input pixel's place in the span
    weights = (1 - ((j - center + 0.5) / support).abs()).clamp_(min=0)
    weights *= (j >= low) & (j < high)
    return weights / weights.sum(-1, keepdim=True)


def crop_resize_batch(images: Sequence[torch.Tensor], boxes: Sequence[Box],
                      size: int) -> torch.Tensor:
    """``N x C x size x size`` float32 (not rounded): each ``C x H x W`` image (any dtype, all
    on one device, sizes may differ) cropped to its box and resized with torch's antialiased
    bilinear interpolation. See NOTE [ A batch resized as two matmuls ]."""
    if len(images) != len(boxes):
        raise ValueError(f"crop_resize_batch: {len(images)} images but {len(boxes)} boxes")
    if not images:
        raise ValueError("crop_resize_batch: no images")
    channels = images[0].shape[0]
    height = max(int(img.shape[1]) for img in images)
    width = max(int(img.shape[2]) for img in images)
    per_image = channels * height * width * 4
    step = max(1, _CHUNK_BYTES // per_image)
    parts = [_resize_chunk(images[k:k + step], boxes[k:k + step], size, height, width)
             for k in range(0, len(images), step)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _resize_chunk(images: Sequence[torch.Tensor], boxes: Sequence[Box], size: int,
                  height: int, width: int) -> torch.Tensor:
    dev = images[0].device
    if all(img.shape[1] == height and img.shape[2] == width for img in images):
        batch = torch.stack(list(images)).to(torch.float32)
    else:
        batch = torch.zeros((len(images), images[0].shape[0], height, width),
                            dtype=torch.float32, device=dev)
        for slot, img in zip(batch, images, strict=True):
            slot[:, :img.shape[1], :img.shape[2]].copy_(img)
    spans = torch.tensor(boxes, dtype=torch.int64).to(dev, non_blocking=True)
    rows = aa_weights(spans[:, 0], spans[:, 2], size, height)  # N x S x H
    cols = aa_weights(spans[:, 1], spans[:, 3], size, width)  # N x S x W
    across = torch.matmul(batch, cols.transpose(1, 2)[:, None])  # N x C x H x S
    return torch.matmul(rows[:, None], across)  # N x C x S x S
