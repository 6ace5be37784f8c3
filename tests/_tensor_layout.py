"""What a program can read of a tensor's storage and layout, besides its values: what the unit
tests compare between torch's own way of making a batch tensor and stoker's."""

from __future__ import annotations

import torch


def tensor_layout(t: torch.Tensor) -> tuple:
    """Type, sharing, offset, shape, strides, the storage's bytes and resizability, dtype,
    device, autograd state, whether it is a view, contiguity."""
    storage = t.untyped_storage()
    return (type(t), t.is_shared(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
            storage.nbytes(), storage.resizable(), t.dtype, t.device, t.requires_grad,
            t.is_leaf, t._base is None, t.is_contiguous())
