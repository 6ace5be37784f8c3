"""What an iterator asks for when it starts: its device feed and its slab pinning, if any."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils.data

from stoker.device.backend import CudaBackend, resolve_device
from stoker.device.feed import DeviceFeed, FeedSpec
from stoker.device.host_pins import HostPins


def make_feed(plan: Any, stats: Any, iterator: Any) -> DeviceFeed | None:
    """The iterator's ``DeviceFeed`` when the pass's ``plan`` has ``device=`` (NOTE [ Batches
    on the device ]); it starts CUDA only when the first batch is copied. ``stats``: the
    loader's accumulator; ``iterator``: the ``HostSource`` the feed pulls from."""
    spec = plan.feed
    if spec is None:
        return None
    if plan.num_workers == 0 and callable(getattr(plan.dataset, "state_dict", None)) and (
        isinstance(plan.dataset, torch.utils.data.IterableDataset)
    ):
        # Its state_dict() is its own position (loader.state_dict() saves it as such): batches
        # pulled ahead would be counted in it. Copy each batch when it is asked for instead.
        spec = dataclasses.replace(spec, ahead=0)
    elif plan.main_rngs:
        # Samples draw from the caller's global RNGs (NOTE [ Main streams resume ]): a batch
        # pulled ahead would draw before the caller's step does (torch never does), and the
        # state's save point would hold draws of batches not handed out.
        spec = dataclasses.replace(spec, ahead=0)
    return DeviceFeed(spec, CudaBackend(spec.device), iterator, stats, pins=iterator.pins)


def host_pins_for(device: torch.device | None, pin_type: str | None) -> HostPins | None:
    """Slab pinning (NOTE [ Slabs pinned in place ]): for ``device=`` (stoker's own copies),
    or for ``pin_memory=True`` on CUDA (the loop's copies); None otherwise (other
    accelerators keep torch's copy into pinned memory)."""
    if device is not None:
        return HostPins(CudaBackend(device), user_copies=False)
    if pin_type == "cuda":
        return HostPins(CudaBackend(None), user_copies=True)
    return None


def feed_spec(device: Any, device_prefetch: Any, device_transform: Any) -> FeedSpec | None:
    """Validate ``device=``/``device_prefetch=``/``device_transform=``; None: CPU batches."""
    if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or (
        device_prefetch < 0
    ):
        raise ValueError(
            f"device_prefetch={device_prefetch!r}: expected the number of batches whose "
            "host-to-device copies are queued ahead of the one handed out (int >= 0; 1 "
            "overlaps the next copy with the current step)."
        )
    if device_transform is not None and not callable(device_transform):
        raise TypeError(
            f"device_transform={device_transform!r} is not callable: pass a function that "
            "takes a batch on the device and returns the batch to hand out, e.g. "
            "lambda b: (b[0].float().div_(255), b[1])."
        )
    dev = resolve_device(device)
    if dev is None:
        if device_transform is not None:
            raise ValueError(
                "device_transform runs on the device right after the copy, so it needs "
                f"device= naming a CUDA device (got device={device!r}). Pass device='cuda', "
                "or apply the function to each batch in your loop."
            )
        return None
    return FeedSpec(dev, device_prefetch, device_transform)
