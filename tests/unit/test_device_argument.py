"""device=, device_prefetch= and device_transform= are checked at construction, with messages
that say what to change (this machine's torch is a CPU build: device='cuda' must say so)."""

from __future__ import annotations

import pytest
import torch

import stoker


def test_device_cuda_without_cuda_says_what_to_change():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(stoker.DeviceUnavailableError) as err:
        stoker.DataLoader([1, 2], device="cuda")
    build = ("this torch is a CPU-only build" if torch.version.cuda is None else
             "torch.cuda.is_available() is False (no GPU visible to this process: check "
             "CUDA_VISIBLE_DEVICES and the driver)")
    assert str(err.value) == (
        f"device='cuda' needs CUDA, but {build} (torch {torch.__version__}). Leave device=None "
        "to receive batches on the CPU, or install a CUDA build of torch and run where a GPU "
        "is visible."
    )
    assert isinstance(err.value, ValueError)


def test_device_cpu_or_none_keeps_torchs_batches():
    for device in (None, "cpu", torch.device("cpu")):
        loader = stoker.DataLoader(list(range(4)), batch_size=2, device=device)
        assert loader.device is None
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("device, expected", [
    ("mps", "device='mps': stoker delivers batches on CUDA devices only. Leave device=None and "
            "move each batch yourself with batch.to(device)."),
    ("gpu", "device='gpu' is not a device: "),
])
def test_other_devices_are_refused(device, expected):
    with pytest.raises(stoker.DeviceUnavailableError) as err:
        stoker.DataLoader([1], device=device)
    assert str(err.value).startswith(expected)


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_device_prefetch_must_be_a_count(value):
    with pytest.raises(ValueError) as err:
        stoker.DataLoader([1], device_prefetch=value)
    assert str(err.value) == (
        f"device_prefetch={value!r}: expected the number of batches whose host-to-device "
        "copies are queued ahead of the one handed out (int >= 0; 1 overlaps the next copy "
        "with the current step)."
    )


def test_device_transform_needs_a_device_and_a_callable():
    with pytest.raises(ValueError) as err:
        stoker.DataLoader([1], device_transform=lambda b: b)
    assert str(err.value) == (
        "device_transform runs on the device right after the copy, so it needs device= naming "
        "a CUDA device (got device=None). Pass device='cuda', or apply the function to each "
        "batch in your loop."
    )
    with pytest.raises(TypeError) as err2:
        stoker.DataLoader([1], device_transform=3)
    assert str(err2.value).startswith("device_transform=3 is not callable: ")
