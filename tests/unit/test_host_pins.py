"""NOTE [ Slabs pinned in place ] on a fake device: registration once per mapping, a refusal
told once, unpinning after the copies that read a slab, and the release gate for the loop's
own copies."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import stoker.device.host_pins as host_pins
from stoker.device.fake import FakeDevice
from stoker.device.host_pins import HostPins


def slab_tensor(nbytes: int = 64) -> torch.Tensor:
    return torch.zeros(nbytes, dtype=torch.uint8)


def test_a_mapping_is_registered_once_and_covers_its_tensors() -> None:
    gpu = FakeDevice()
    pins = HostPins(gpu, user_copies=False)
    slab = slab_tensor()
    address = slab.data_ptr()
    pins.pin(address, 64)
    pins.pin(address, 64)  # the fake asserts if registered twice
    assert gpu.registered == {address: 64} and pins.registered_bytes == 64
    assert pins.covers(slab[8:16]) and pins.covers(slab.view(8, 8).t())
    assert not pins.covers(torch.zeros(4))


def test_a_leaf_inside_the_slab_is_covered_and_its_copy_noted() -> None:
    """A batch's second leaf is read with torch.frombuffer at an offset: its storage starts
    inside the slab, not at it (it was pinned again by a copy, and its copy not waited for)."""
    import ctypes

    gpu = FakeDevice()
    pins = HostPins(gpu, user_copies=False)
    lease = (ctypes.c_ubyte * 256)()
    address = ctypes.addressof(lease)
    pins.pin(address, 256)
    second = torch.frombuffer(lease, dtype=torch.uint8, count=64, offset=128)
    assert pins.covers(second)
    past_end = torch.frombuffer((ctypes.c_ubyte * 64).from_address(address + 224), count=64,
                                dtype=torch.uint8)
    assert not pins.covers(past_end)  # starts inside, ends beyond: not this slab's
    event = gpu.new_event()
    pins.note_copy(second, event)
    assert pins._last_copy == {address: event}


def test_unpin_waits_for_the_last_copy_from_the_slab() -> None:
    gpu = FakeDevice()
    pins = HostPins(gpu, user_copies=False)
    slab = slab_tensor()
    pins.pin(slab.data_ptr(), 64)
    side = gpu.new_stream()
    with gpu.on_stream(side):
        gpu.copy(slab)
        done = gpu.new_event()
        done.record(side)
    pins.note_copy(slab[4:], done)
    assert not done.query()
    pins.unpin(slab.data_ptr())
    assert done.query() and gpu.unregistered == [slab.data_ptr()]
    assert gpu.synchronized == 0  # only that event, not the whole device
    pins.unpin(slab.data_ptr())  # twice: nothing more
    assert gpu.unregistered == [slab.data_ptr()]


def test_with_the_loops_copies_unpin_synchronizes_the_device() -> None:
    gpu = FakeDevice()
    pins = HostPins(gpu, user_copies=True)
    slab = slab_tensor()
    pins.pin(slab.data_ptr(), 64)
    pins.unpin(slab.data_ptr())
    assert gpu.synchronized == 1 and not gpu.registered


def test_released_slabs_wait_for_an_event_on_the_current_stream() -> None:
    gpu = FakeDevice()
    pins = HostPins(gpu, user_copies=True)
    pins.pin(slab_tensor().data_ptr(), 64)
    gpu.compute(1.0)  # the loop's step, with its copy, still queued on its stream
    assert pins.gate([(0, 1), (0, 2)]) == []
    assert pins.held() == 2
    assert pins.gate([(1, 5)]) == []
    gpu.run()
    assert pins.gate([]) == [(0, 1), (0, 2), (1, 5)]
    assert pins.held() == 0


def test_stokers_own_copies_need_no_gate() -> None:
    pins = HostPins(FakeDevice(), user_copies=False)
    pins.pin(slab_tensor().data_ptr(), 64)
    assert pins.gate([(0, 1)]) == [(0, 1)]


def test_a_refusal_is_told_once_and_everything_is_copied_instead(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(host_pins, "_told_refusal", False)
    gpu = FakeDevice(refuse="cudaHostRegister returned error 1 (invalid argument)")
    pins = HostPins(gpu, user_copies=True)
    # Told on stoker's logger, never through warnings (issue 44): under "error" one would raise.
    with caplog.at_level(logging.WARNING, "stoker.device.host_pins"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        pins.pin(slab_tensor().data_ptr(), 64)
        HostPins(gpu, user_copies=True).pin(slab_tensor().data_ptr(), 64)  # said once
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [(
        "stoker.device.host_pins", logging.WARNING,
        "stoker: could not page-lock its shared-memory slabs in place (cudaHostRegister "
        "returned error 1 (invalid argument)), so pin_memory=True copies each batch into "
        "pinned memory as torch's DataLoader does (a second copy of every batch on the CPU). "
        "Registering host memory can be refused in containers limiting locked memory, or "
        "under a driver without host registration; batches are correct either way."
    )]
    assert pins.refused is not None and not pins.covers(slab_tensor())
    assert pins.gate([(0, 1)]) == [(0, 1)]  # nothing registered: torch's copies, no gate
