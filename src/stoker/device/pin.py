"""Pin a batch's tensors in page-locked memory, walking containers like torch's pin thread."""

from __future__ import annotations

import collections.abc
import copy
import warnings
from typing import Any

import torch


def pin_target(pin_memory: bool, pin_memory_device: str) -> str | None:
    """The accelerator to pin for, or None; warns exactly where torch's DataLoader warns."""
    if pin_memory and pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_memory_device}'.",
            stacklevel=4,
        )
    if not pin_memory:
        return None
    if not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=4,
        )
        return None
    acc = torch.accelerator.current_accelerator()
    if acc is None:
        return None
    if acc.type == "mps":
        warnings.warn(
            "'pin_memory' argument is set as true but not supported on MPS now, "
            "device pinned memory won't be used.",
            stacklevel=4,
        )
        return None
    return acc.type


def pin_batch(data: Any) -> Any:
    if isinstance(data, torch.Tensor) or (
        hasattr(data, "pin_memory") and not isinstance(data, (str, bytes))
    ):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_batch(v) for k, v in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(pinned)
                return clone
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(pin_batch(v) for v in data))
        return type(data)(pin_batch(v) for v in data)
    if isinstance(data, collections.abc.Sequence):
        items = [pin_batch(v) for v in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone_seq = copy.copy(data)
                for i, item in enumerate(items):
                    clone_seq[i] = item
                return clone_seq
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data
