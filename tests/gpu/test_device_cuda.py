"""device= and pin_memory=True on a real CUDA device: slabs registered in place report
is_pinned(), batches arrive on the device with the right values while a worker reuses slabs
under a slow consumer stream, the consumer's stream waits on events, resume and several loaders
at once, the refusal fallback, and the errors."""

from __future__ import annotations

import gc

import pytest
import torch

import stoker


class Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> tuple:
        # 48 KiB images: a batch of 8 is over SMALL_LEAF_BYTES, so its images stay in the slab
        # (NOTE [ Small leaves do not hold the slab ]) while its labels are copied out.
        return torch.full((3, 128, 128), i % 251, dtype=torch.uint8), i


def _loader(dataset: torch.utils.data.Dataset | None = None, **kw) -> stoker.DataLoader:
    args = dict(batch_size=8, shuffle=True, num_workers=2,
                generator=torch.Generator().manual_seed(1))
    args.update(kw)
    return stoker.DataLoader(Images() if dataset is None else dataset, **args)


def _check(x: torch.Tensor, i: torch.Tensor) -> None:
    expect = (i % 251).to(torch.uint8)[:, None, None, None].expand_as(x)
    assert torch.equal(x, expect)


class ImagesAndMasks(Images):
    def __getitem__(self, i: int) -> tuple:
        x, i = super().__getitem__(i)
        return x, torch.ones((2, 128, 128), dtype=torch.uint8), i


def test_pin_memory_at_the_defaults_pins_as_torch_does():
    """Without slab_transport a batch arrives as torch's does (its own shared memory), so it
    is pinned by a copy, as torch's pin thread does; nothing is registered."""
    it = iter(_loader(pin_memory=True, dataset=ImagesAndMasks()))
    x, masks, i = next(it)
    assert x.is_pinned() and masks.is_pinned() and i.is_pinned()
    pins = it._pins
    assert pins is None or pins.registered_bytes == 0
    _check(x, i)
    del it, x, masks, i
    gc.collect()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pinned_batch_is_made_outside_the_programs_inference_mode(num_workers):
    """torch pins in its pin thread, where the caller's inference_mode is not: a batch handed
    out inside it is an ordinary tensor, as under torch's loader."""
    ds = torch.utils.data.TensorDataset(torch.arange(16.).view(8, 2))
    got = []
    for cls in (torch.utils.data.DataLoader, stoker.DataLoader):
        loader = cls(ds, batch_size=4, pin_memory=True, num_workers=num_workers)
        with torch.inference_mode():
            (x,) = next(iter(loader))
        got.append((x.is_pinned(), x.is_inference()))
        del loader, x
        gc.collect()
    assert got[1] == got[0]


def test_pin_memory_batches_are_pinned_in_place_without_a_copy():
    it = iter(_loader(pin_memory=True, dataset=ImagesAndMasks(),
                      beyond_torch={"slab_transport"}))
    x, masks, i = next(it)
    assert x.is_pinned() and masks.is_pinned() and i.is_pinned()
    pins = it._pins
    assert pins is not None and pins.refused is None
    # Images and masks in place (the masks start inside the slab), labels copied out and pinned.
    assert pins.covers(x) and pins.covers(masks) and not pins.covers(i)
    _check(x, i)
    del it, x, masks, i
    gc.collect()


def test_device_batches_are_right_under_a_slow_consumer_stream():
    loader = _loader(device="cuda", device_prefetch=2)
    for x, i in loader:
        assert x.device.type == "cuda" and i.device.type == "cuda"
        torch.cuda._sleep(2_000_000)  # the step: the copy stream runs ahead of it
        _check(x, i)
    stats = loader.stats()
    assert stats.device_batches == 12 and stats.device_copy_s > 0


def test_device_transform_runs_after_the_copy():
    def to_float(batch):
        x, i = batch
        return x.float().div_(255).contiguous(memory_format=torch.channels_last), i

    for x, i in _loader(device="cuda", device_transform=to_float):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x * 255, (i % 251).float()[:, None, None, None].expand_as(x))


def test_resume_and_two_loaders_at_once():
    ref = [i.tolist() for _, i in _loader()]
    a = _loader(device="cuda", device_prefetch=3)
    it = iter(a)
    got = [next(it)[1].tolist() for _ in range(4)]
    state = a.state_dict()
    assert state["batches"] == 4
    b = _loader(device="cuda")
    b.load_state_dict(state)
    c = _loader(device="cuda", num_workers=1)
    rest, other = [], []
    for (_, ib), (_, ic) in zip(b, c, strict=False):  # b resumes with 8 left of 12
        rest.append(ib.tolist())
        other.append(ic.tolist())
    assert got + rest == ref and len(other) == 8 and other == ref[:8]


def test_a_batch_on_another_device_is_refused():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")

    def on_cuda1(batch):
        return torch.stack(batch).to("cuda:1")

    loader = stoker.DataLoader([torch.ones(2)] * 4, batch_size=2, collate_fn=on_cuda1,
                               device="cuda:0")
    with pytest.raises(stoker.BatchDeviceError, match="got a batch holding a tensor on cuda:1"):
        next(iter(loader))


def test_a_bad_device_index_is_refused():
    with pytest.raises(stoker.DeviceUnavailableError, match="this process sees"):
        stoker.DataLoader([1], device=f"cuda:{torch.cuda.device_count()}")


def _decode(jpegs: list[bytes], decode_on: str, seed: int) -> torch.Tensor:
    from stoker.device import feed
    from stoker.image import DecodeImages

    feed._BATCH.seed, feed._BATCH.device = seed, torch.device("cuda", 0)
    try:
        return DecodeImages(size=64, decode_on=decode_on)(jpegs)
    finally:
        feed._BATCH.seed = feed._BATCH.device = None


def test_gpu_decode_matches_the_cpu_path_within_decoder_rounding():
    pytest.importorskip("torchvision", reason="GPU decoding needs torchvision")
    import io

    import numpy as np
    from PIL import Image

    # Smooth photos-like fields: decoders round apart by a level or two there, while a crop
    # in the wrong place differs by tens. (Pure noise made nvJPEG and libjpeg differ by 3.3
    # levels on the H100 with the crops right, as much as a crop off by a few pixels.)
    jpegs = []
    for k in range(6):
        coarse = np.random.default_rng(k).integers(0, 256, (5, 7, 3), dtype=np.uint8)
        field = Image.fromarray(coarse).resize((300, 200 + k), Image.BICUBIC)
        buf = io.BytesIO()
        field.save(buf, format="JPEG", quality=95)
        jpegs.append(buf.getvalue())
    gpu, cpu = _decode(jpegs, "cuda", 7), _decode(jpegs, "cpu", 7)
    other_crops = _decode(jpegs, "cpu", 8)
    assert gpu.device.type == cpu.device.type == "cuda" and gpu.shape == (6, 3, 64, 64)
    same = (gpu.int() - cpu.int()).abs().float().mean().item()
    apart = (gpu.int() - other_crops.int()).abs().float().mean().item()
    assert same < 2.5 and apart > 3 * same, (same, apart)  # same crops, decoders round apart


def test_the_batched_nvjpeg_decoder_takes_a_list_and_decodes_on_the_device():
    """What tests/unit/test_decode_images_batched.py stands in for: torchvision's decode_jpeg
    called once with the batch's list, each image RGB on the device, the batch's order."""
    pytest.importorskip("torchvision", reason="GPU decoding needs torchvision")
    import io

    import numpy as np
    from PIL import Image

    from stoker.image import gpu_decode

    decoder = gpu_decode._gpu_decoder()
    assert decoder is not None
    data, sizes = [], [(40, 60), (33, 47), (64, 64)]
    for k, (h, w) in enumerate(sizes):
        buf = io.BytesIO()
        pixels = np.random.default_rng(k).integers(0, 256, (h, w), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="JPEG")  # greyscale: RGB asked for
        data.append(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8))
    out = decoder(data, torch.device("cuda", 0))
    assert [tuple(img.shape) for img in out] == [(3, h, w) for h, w in sizes]
    assert all(img.device.type == "cuda" and img.dtype == torch.uint8 for img in out)


def test_gpu_decode_in_chunks_on_a_side_stream_matches_the_cpu_path():
    """NOTE [ Decoded a chunk ahead ]: a batch of several chunks decoded on the decode thread
    on the caller's (side) stream, cropped and resized on the caller's thread: the CPU path's
    crops within decoder rounding, image by image (a chunk's images read before its decode
    finished would differ by tens)."""
    pytest.importorskip("torchvision", reason="GPU decoding needs torchvision")
    import io

    import numpy as np
    from PIL import Image

    from stoker.image import gpu_decode

    jpegs = []
    for k in range(2 * gpu_decode.DECODE_CHUNK + 5):
        coarse = np.random.default_rng(100 + k).integers(0, 256, (4, 5, 3), dtype=np.uint8)
        field = Image.fromarray(coarse).resize((96 + k % 7, 80), Image.BICUBIC)
        buf = io.BytesIO()
        field.save(buf, format="JPEG", quality=95)
        jpegs.append(buf.getvalue())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gpu = _decode(jpegs, "cuda", 11)
    torch.cuda.current_stream().wait_stream(side)
    cpu = _decode(jpegs, "cpu", 11)
    assert gpu.shape == (len(jpegs), 3, 64, 64)
    per_image = (gpu.int() - cpu.int()).abs().float().mean(dim=(1, 2, 3))
    assert per_image.max().item() < 2.5, per_image
