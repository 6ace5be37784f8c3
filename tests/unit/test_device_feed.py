"""The device feed's scheduling (NOTE [ Batches on the device ]) on a fake device: copies
queued ahead, slabs held until their copy ran, the consumer's stream waiting on events,
``record_stream`` on every device tensor, delivery records applied at hand-out, errors in
their turn, and the copy/wait measurements."""

from __future__ import annotations

import collections
import ctypes
import gc
import weakref
from typing import Any

import pytest
import torch

from stoker.device.fake import FakeDevice
from stoker.device.feed import DeviceFeed, FeedSpec, current_batch_seed
from stoker.engine.stats import NoStats, StatsAccumulator
from stoker.errors import BatchDeviceError

Pair = collections.namedtuple("Pair", "x y")


class SlabSource:
    """Host batches in reused "slabs" like the engine's: batch ``p`` is ``float32`` values
    ``p * 100 + arange(n)`` in a slab; when the batch's lease dies, the slab is overwritten at
    once with -1 (a worker collating the next batch into it)."""

    def __init__(self, count: int, n: int = 8, fail_at: tuple[int, ...] = ()) -> None:
        self.count, self.n, self.fail_at = count, n, fail_at
        self.position = 0
        self.held: list[Any] | None = None
        self.applied: list[int] = []
        self.slabs: list[bytearray] = []
        self.free: list[int] = []
        self.overwritten = 0

    def _slab(self) -> int:
        if self.free:
            return self.free.pop()
        self.slabs.append(bytearray(self.n * 4))
        return len(self.slabs) - 1

    def _released(self, slot: int) -> None:
        torch.frombuffer(self.slabs[slot], dtype=torch.float32).fill_(-1.0)
        self.overwritten += 1
        self.free.append(slot)

    def next_host(self) -> Any:
        if self.position >= self.count:
            raise StopIteration
        p = self.position
        self.position += 1
        assert self.held is not None, "pulled without holding deliveries"
        self.held.append((p, None))
        if p in self.fail_at:
            raise KeyError(f"sample of batch {p}")
        slot = self._slab()
        lease = (ctypes.c_ubyte * (self.n * 4)).from_buffer(self.slabs[slot])
        weakref.finalize(lease, self._released, slot)
        x = torch.frombuffer(lease, dtype=torch.float32)
        x.copy_(torch.arange(self.n, dtype=torch.float32) + p * 100)
        return {"x": x, "y": Pair(x[:2], f"name{p}"), "z": [x[2:4], 7]}

    def hold_deliveries(self) -> None:
        self.held = []

    def release_deliveries(self) -> list[Any]:
        held, self.held = self.held or [], None
        return held

    def apply_deliveries(self, deliveries: list[Any]) -> None:
        self.applied.extend(p for p, _ in deliveries)

    def seed_of(self, deliveries: list[Any]) -> int | None:
        return 1000 + deliveries[-1][0] if deliveries else None


def expected(p: int, n: int = 8) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + p * 100


def make(count: int = 6, ahead: int = 1, transform: Any = None, **kw: Any) -> tuple:
    gpu = FakeDevice(bandwidth_bytes_per_s=32.0)  # 32 bytes (one batch) per second
    source = SlabSource(count, **kw)
    stats = StatsAccumulator(0)
    feed = DeviceFeed(FeedSpec(torch.device("cpu"), ahead, transform), gpu, source, stats)
    return gpu, source, stats, feed


def test_every_tensor_is_copied_and_the_structure_kept() -> None:
    gpu, source, _, feed = make(count=2)
    batch = feed.next()
    gpu.run()
    assert set(batch) == {"x", "y", "z"}
    assert type(batch["y"]) is Pair and batch["y"].y == "name0" and batch["z"][1] == 7
    for t in (batch["x"], batch["y"].x, batch["z"][0]):
        assert gpu.where(t) == "device"
    assert torch.equal(batch["x"], expected(0))
    assert torch.equal(batch["y"].x, expected(0)[:2])
    assert torch.equal(batch["z"][0], expected(0)[2:4])


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_copies_are_queued_ahead_by_the_window(ahead: int) -> None:
    gpu, source, _, feed = make(count=10, ahead=ahead)
    feed.next()
    assert source.position == ahead + 1  # the handed-out batch plus `ahead` queued
    side = gpu.streams[1]
    assert sum(kind == "copy" for kind, _ in side.ops) == 3 * (ahead + 1)
    feed.next()
    assert source.position == ahead + 2


def test_no_slab_is_released_before_its_copy_ran() -> None:
    gpu, source, _, feed = make(count=6, ahead=2)
    batches = [feed.next() for _ in range(4)]  # the "GPU" has run nothing yet
    gc.collect()
    assert source.overwritten == 0, "a slab was released while its copy was still queued"
    gpu.run()
    for p, batch in enumerate(batches):
        assert torch.equal(batch["x"], expected(p)), f"batch {p} read an overwritten slab"
    feed.next()  # reaps: the copies of all 6 pulled batches ran, so their slabs go
    gc.collect()
    assert source.overwritten == 6
    # ...and the overwrite is real: a released slab holds the next worker's bytes.
    assert any(torch.frombuffer(s, dtype=torch.float32)[0] == -1 for s in source.slabs)


def test_consumer_stream_waits_on_the_copy_event_and_keeps_the_memory() -> None:
    gpu, source, _, feed = make(count=3)
    mine = gpu.new_stream()
    with gpu.on_stream(mine):
        batch = feed.next()
    waits = [arg for kind, arg in mine.ops if kind == "wait"]
    assert len(waits) == 1 and not waits[0].done  # a device-side wait, nothing synchronized
    copy_stream = feed._stream
    assert copy_stream is not mine and ("record", waits[0]) in copy_stream.ops
    kept = {(ptr, stream) for ptr, stream in gpu.kept}
    for t in (batch["x"], batch["y"].x, batch["z"][0]):
        assert (t.data_ptr(), mine) in kept
    assert gpu.synchronized == 0


def test_deliveries_count_when_handed_out_not_when_copied() -> None:
    gpu, source, _, feed = make(count=5, ahead=2)
    feed.next()
    assert source.position == 3 and source.applied == [0]
    feed.next()
    assert source.applied == [0, 1]
    rest = []
    while True:
        try:
            rest.append(feed.next())
        except StopIteration:
            break
    assert len(rest) == 3 and source.applied == [0, 1, 2, 3, 4]


def test_an_error_ahead_is_raised_in_its_turn() -> None:
    gpu, source, _, feed = make(count=5, ahead=2, fail_at=(2,))
    assert torch.equal(_run(gpu, feed.next())["x"], expected(0))
    assert torch.equal(_run(gpu, feed.next())["x"], expected(1))
    assert source.position == 3  # pulled batch 2, failed: stopped pulling past it
    with pytest.raises(KeyError, match="sample of batch 2"):
        feed.next()
    assert source.applied == [0, 1, 2]  # a failed batch counts as delivered, as without device=
    assert torch.equal(_run(gpu, feed.next())["x"], expected(3))


def _run(gpu: FakeDevice, batch: Any) -> Any:
    gpu.run()
    return batch


def test_transform_runs_on_the_copy_stream_with_the_batch_seed() -> None:
    seen = []

    def transform(batch: dict) -> dict:
        seen.append((gpu.current_stream(), current_batch_seed()))
        return {"x": batch["x"], "seed": current_batch_seed()}

    gpu, source, _, feed = make(count=3, ahead=1, transform=transform)
    out = [feed.next() for _ in range(3)]
    gpu.run()
    assert [s for _, s in seen] == [1000, 1001, 1002]
    assert all(stream is gpu.streams[1] for stream, _ in seen)
    assert current_batch_seed() is None
    assert torch.equal(out[2]["x"], expected(2)) and out[2]["seed"] == 1002


def test_device_time_of_copies_and_of_the_wait_is_measured() -> None:
    # 32 bytes/s: each batch's 3 copies (32 + 8 + 8 bytes) take 1.5 s of copy-stream time.
    gpu, source, stats, feed = make(count=4, ahead=0)
    for _ in range(4):
        feed.next()
        gpu.compute(0.5)  # the step: shorter than the copy, so the consumer waits
        gpu.run()
    feed.reset()
    assert stats.device_copy_s == pytest.approx(4 * 1.5)
    assert stats.device_bytes == 4 * 48 and stats.device_batches == 4
    # Batch 0's copy runs from t=0 to 1.5 while the consumer is at 0: it waits 1.5 s. (The
    # fake's copy stream has no idle time: each later copy starts where the previous ended,
    # 0.5 s before the consumer, finished its 0.5 s step, asks; it waits 1.0 s.)
    assert stats.device_wait_s == pytest.approx(1.5 + 3 * 1.0)


def test_no_timing_events_when_stats_are_off() -> None:
    gpu = FakeDevice()
    source = SlabSource(3)
    feed = DeviceFeed(FeedSpec(torch.device("cpu"), 1, None), gpu, source, NoStats(0))
    feed.next()
    assert not [op for op in gpu.default.ops if op[0] == "record"]


def test_reset_waits_for_abandoned_copies_before_their_slabs_go() -> None:
    gpu, source, _, feed = make(count=6, ahead=2)
    feed.next()
    feed.reset()
    gc.collect()
    assert all(not s.ops or all(k != "copy" for k, _ in s.ops) for s in gpu.streams)
    assert source.overwritten == 3


def test_a_tensor_on_another_device_is_refused() -> None:
    class Other(FakeDevice):
        def where(self, tensor: torch.Tensor) -> str:
            return "other"

    gpu, source = Other(), SlabSource(2)
    feed = DeviceFeed(FeedSpec(torch.device("cuda", 0), 0, None), gpu, source,
                      StatsAccumulator(0))
    with pytest.raises(BatchDeviceError) as err:
        feed.next()
    assert str(err.value) == (
        "DataLoader(device='cuda:0') got a batch holding a tensor on cpu; it moves CPU tensors "
        "to cuda:0 and passes tensors already there through, but will not move data between "
        "accelerators behind your back. Return CPU tensors from the dataset and collate_fn "
        "(the loader copies them), or create them on cuda:0."
    )


def test_tensors_already_on_the_device_pass_through_after_the_consumer() -> None:
    gpu = FakeDevice()
    resident = gpu.copy(torch.ones(3))  # "made on the device" by the consumer's stream

    class One:
        held: list | None = None

        def next_host(self) -> Any:
            self.held.append((0, None))
            self.next_host = lambda: (_ for _ in ()).throw(StopIteration)
            return resident

        def hold_deliveries(self) -> None:
            self.held = []

        def release_deliveries(self) -> list:
            return self.held

        def apply_deliveries(self, d: list) -> None:
            pass

        def seed_of(self, d: list) -> None:
            return None

    feed = DeviceFeed(FeedSpec(torch.device("cpu"), 0, None), gpu, One(), StatsAccumulator(0))
    assert feed.next() is resident
    waits = [arg for kind, arg in gpu.streams[1].ops if kind == "wait"]
    assert len(waits) == 1  # the copy stream waits for the consumer's work so far


def test_the_real_and_the_fake_backend_have_the_same_event_and_stream_contract() -> None:
    """The fake's streams once took the feed's event wrappers in ``wait_event``; torch's
    ``Stream.wait_event`` calls ``event.wait(stream)``, which the wrapper lacked, and every
    ``device=`` batch failed on a real GPU. The feed calls only what ``backend.Event`` names."""
    import inspect

    from stoker.device import backend, fake

    wanted = {n for n, _ in inspect.getmembers(backend.Event, inspect.isfunction)
              if not n.startswith("_")}
    assert {"record", "query", "synchronize", "wait", "elapsed_s"} <= wanted
    for event_class in (backend._CudaEvent, fake.FakeEvent):
        assert wanted <= set(dir(event_class)), event_class
    assert not hasattr(fake.FakeStream, "wait_event")  # streams are opaque to the feed
