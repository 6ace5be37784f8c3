"""The device feed on the real engine (forked workers, real slabs), with the fake device
standing in for CUDA: batches come out in torch's order with torch's values, slabs are
registered in place and unregistered when they go, resume state is that of the batches handed
out, and several loaders feed at once. The CUDA calls themselves are covered by tests/gpu."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import stoker
import stoker.device.attach as attach
from stoker.device.fake import FakeDevice
from stoker.device.feed import FeedSpec


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((4096,), float(i)), "i": i}


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    fake = FakeDevice()
    monkeypatch.setattr(attach, "CudaBackend", lambda device: fake)
    return fake


def _loader(ahead: int = 1, **kwargs: Any) -> stoker.DataLoader:
    args: dict[str, Any] = dict(batch_size=4, shuffle=True, num_workers=2)
    args["generator"] = torch.Generator().manual_seed(5)
    args.update(kwargs)
    loader = stoker.DataLoader(Rows(), **args)
    loader._stoker_feed_spec = FeedSpec(torch.device("cpu"), ahead, None)  # the fake's device
    return loader


def _reference(**kwargs: Any) -> list[list[int]]:
    args: dict[str, Any] = dict(batch_size=4, shuffle=True, num_workers=0)
    args["generator"] = torch.Generator().manual_seed(5)
    args.update(kwargs)
    return [b["i"].tolist() for b in torch.utils.data.DataLoader(Rows(), **args)]


def _take(gpu: FakeDevice, it: Any, n: int | None = None) -> list[list[int]]:
    out = []
    for batch in it:
        gpu.run()  # the consumer's step: its stream ran past the wait for the copy
        assert gpu.where(batch["x"]) == "device" and gpu.where(batch["i"]) == "device"
        assert torch.equal(batch["x"], batch["i"].float()[:, None].expand(-1, 4096))
        out.append(batch["i"].tolist())
        if n is not None and len(out) == n:
            break
    return out


def test_batches_arrive_on_the_device_in_order_from_registered_slabs(gpu: FakeDevice) -> None:
    loader = _loader(ahead=2)
    it = iter(loader)
    assert _take(gpu, it) == _reference()
    del it
    gc.collect()
    assert len(gpu.unregistered) >= 2, "the slabs of the 2 workers were not page-locked"
    assert not gpu.registered, "a slab was unmapped without being unregistered"
    stats = loader.stats()
    assert stats.device_batches == 10 and stats.device_bytes == 10 * 4 * (4096 * 4 + 8)


def test_state_is_that_of_batches_handed_out_not_copied_ahead(gpu: FakeDevice) -> None:
    loader = _loader(ahead=3)
    it = iter(loader)
    first = _take(gpu, it, 3)
    state = loader.state_dict()
    assert state["batches"] == 3  # 6 were pulled from the workers by now
    del it
    resumed = _loader(ahead=3)
    resumed.load_state_dict(state)
    assert first + _take(gpu, iter(resumed)) == _reference()


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_and_an_epoch_left_early(gpu: FakeDevice, persistent: bool) -> None:
    loader = _loader(ahead=2, persistent_workers=persistent)
    reference = _reference()
    _take(gpu, iter(loader), 2)  # left early: its queued copies are abandoned
    second = _take(gpu, iter(loader))
    assert sorted(sum(second, [])) == list(range(40)) and len(second) == len(reference)
    del loader
    gc.collect()


def test_two_loaders_feed_at_once(gpu: FakeDevice) -> None:
    a, b = _loader(ahead=1), _loader(ahead=2, num_workers=1)
    got_a, got_b = [], []
    for batch_a, batch_b in zip(a, b, strict=True):
        gpu.run()
        got_a.append(batch_a["i"].tolist())
        got_b.append(batch_b["i"].tolist())
    assert got_a == got_b == _reference()


class Encoded(torch.utils.data.Dataset):
    """PNG bytes (lossless, so both runs decode identical pixels) and the index."""

    def __init__(self) -> None:
        import io

        import numpy as np
        from PIL import Image

        self.items = []
        for i in range(12):
            pixels = np.random.default_rng(i).integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="PNG")
            self.items.append(buf.getvalue())

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple:
        return self.items[i], i


@pytest.mark.parametrize("workers", [0, 2])
def test_decoded_crops_do_not_depend_on_num_workers(gpu: FakeDevice, workers: int) -> None:
    from stoker.image import DecodeImages

    def run(num_workers: int) -> list[torch.Tensor]:
        loader = stoker.DataLoader(Encoded(), batch_size=4, shuffle=True,
                                   num_workers=num_workers,
                                   generator=torch.Generator().manual_seed(2))
        loader._stoker_feed_spec = FeedSpec(torch.device("cpu"), 1, DecodeImages(size=8))
        out = []
        for images, _ in loader:
            gpu.run()
            assert images.shape == (4, 3, 8, 8) and images.dtype == torch.uint8
            out.append(images)
        return out

    first, other = run(workers), run(1)
    assert len(first) == 3
    assert all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


class Counting(torch.utils.data.IterableDataset):
    """An iterable whose own state_dict() is its position (resumed by the dataset itself)."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        while self.position < 12:
            self.position += 1
            yield self.position - 1

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def test_an_iterable_that_keeps_its_own_position_is_not_read_ahead(gpu: FakeDevice) -> None:
    def loader_of(ds: Counting) -> stoker.DataLoader:
        loader = stoker.DataLoader(ds, batch_size=2)
        loader._stoker_feed_spec = FeedSpec(torch.device("cpu"), 3, None)
        return loader

    loader = loader_of(Counting())
    it = iter(loader)
    got = []
    for _ in range(2):
        batch = next(it)
        gpu.run()
        got.append(batch.tolist())
    state = loader.state_dict()
    assert state["dataset_state"] == {"position": 4}  # what was handed out, not read ahead
    resumed = loader_of(Counting())
    resumed.load_state_dict(state)
    rest = []
    for batch in resumed:
        gpu.run()
        rest.append(batch.tolist())
    assert got + rest == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


class Drawing(torch.utils.data.Dataset):
    """A random augmentation from torch's global RNG: under torch's seeding with
    ``num_workers=0`` that is the caller's own stream."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(2) + i


def _steps(gpu: FakeDevice | None, it: Any, n: int | None = None) -> list[Any]:
    """Each batch, then the caller's step drawing from the same global RNG (dropout, say)."""
    out = []
    for batch in it:
        if gpu is not None:
            gpu.run()
        out.append((batch.tolist(), torch.rand(1).item()))
        if n is not None and len(out) == n:
            break
    return out


def test_the_callers_global_rngs_are_not_drawn_ahead(
    gpu: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE [ Main streams resume ]: a batch loaded ahead would draw before the caller's step,
    # which torch never does, and the state's save point would hold its draws: device= copies
    # each batch when it is asked for there, and the resume is exact.
    monkeypatch.delenv("STOKER_BEYOND_TORCH", raising=False)

    def loader_of() -> stoker.DataLoader:
        loader = stoker.DataLoader(Drawing(), batch_size=2, shuffle=True,
                                   generator=torch.Generator().manual_seed(5))
        loader._stoker_feed_spec = FeedSpec(torch.device("cpu"), 3, None)
        return loader

    torch.manual_seed(0)
    expected = _steps(None, torch.utils.data.DataLoader(
        Drawing(), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(0)
    loader = loader_of()
    it = iter(loader)
    head = _steps(gpu, it, 2)
    state = loader.state_dict()
    del it
    torch.manual_seed(99)  # the resumed process drew something else before loading
    resumed = loader_of()
    resumed.load_state_dict(state)
    assert head + _steps(gpu, resumed) == expected
    per_batch = stoker.DataLoader(Drawing(), batch_size=2, seeding="per_batch")
    per_batch._stoker_feed_spec = FeedSpec(torch.device("cpu"), 3, None)
    it = iter(per_batch)
    assert it._feed._spec.ahead == 3  # per-batch seeding draws nothing of the caller's
    del it
