"""Pin a batch's tensors in page-locked memory, walking containers like torch's pin thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from stoker._core.torch_voice import PIN_SINGLE_PROCESS, PIN_WORKERS, warn_as_torch
from stoker.device.tree import map_batch


def pin_target(pin_memory: bool, pin_memory_device: str, workers: bool) -> str | None:
    """The accelerator to pin for, or None. Warns what torch's iterator warns when it starts,
    attributed where torch's are (``workers``: torch's worker iterator's line, else its
    single-process one; NOTE [ torch's voice ])."""
    site = PIN_WORKERS if workers else PIN_SINGLE_PROCESS
    if pin_memory and pin_memory_device:
        warn_as_torch(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_memory_device}'.",
            site,
        )
    if not pin_memory:
        return None
    if not torch.accelerator.is_available():
        warn_as_torch(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            site,
        )
        return None
    acc = torch.accelerator.current_accelerator()
    if acc is None:
        return None
    if acc.type == "mps":
        warn_as_torch(
            "'pin_memory' argument is set as true but not supported on MPS now, "
            "device pinned memory won't be used.",
            site,
        )
        return None
    return acc.type


def _pinnable(data: Any) -> bool:
    return isinstance(data, torch.Tensor) or (
        hasattr(data, "pin_memory") and not isinstance(data, (str, bytes))
    )


def pin_batch(data: Any, keep: Callable[[torch.Tensor], bool] | None = None) -> Any:
    """``data`` with its tensors pinned (copied into page-locked memory) as torch's pin
    thread does; tensors ``keep`` accepts are pinned already (NOTE [ Slabs pinned in place ])
    and stay as they are."""

    def pin(item: Any) -> Any:
        if keep is not None and isinstance(item, torch.Tensor) and keep(item):
            return item
        return item.pin_memory()

    return map_batch(data, pin, _pinnable)
