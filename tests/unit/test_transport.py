"""Slab transport without processes: pack in a 'worker', unpack in a 'main', reuse, leases."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch

from stoker.collate import allocating_into, default_collate
from stoker.transport import segments, slab_reader
from stoker.transport.slab_bank import BankedSlab, SlabBank
from stoker.transport.slab_reader import SlabReader
from stoker.transport.slab_writer import SlabPool, write_batch


@pytest.fixture
def link():
    """A pool and a reader wired as the worker loop wires them (fd dup'ed instead of sent)."""
    reader = SlabReader()
    created = []

    def announce(fd, ref):
        created.append(ref.segment_id)
        reader.adopt(0, ref, os.dup(fd))

    pool = SlabPool(announce, max_idle=2)
    yield pool, reader, created
    pool.close()
    reader.close()


def roundtrip(pool, reader, batch, collate=False):
    slab = pool.acquire()
    if collate:
        with allocating_into(slab):
            batch = default_collate(batch)
    sid, used, payload = write_batch(pool, slab, batch)
    return reader.unpack(0, sid, used, payload), sid, len(payload)


def recycle(pool, reader):
    gc.collect()
    for _, ids in reader.take_released().items():
        pool.release(ids)


def test_structure_roundtrips_with_tensors_and_arrays_intact(link):
    pool, reader, _ = link
    batch = {
        "f": torch.randn(4, 3),
        "i8": torch.arange(12, dtype=torch.int8).reshape(3, 4),
        "b": torch.tensor([True, False]),
        "c": torch.randn(2, dtype=torch.complex64),
        "h": torch.randn(5).half(),
        "nd": np.arange(10, dtype=np.float64).reshape(2, 5),
        "rec": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
        "meta": ["a", b"b", 3, None],
        "empty": torch.empty(0, 7),
    }
    out, sid, payload_len = roundtrip(pool, reader, batch)
    assert sid is not None
    assert out.keys() == batch.keys()
    for key in ("f", "i8", "b", "c", "h", "empty"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key]), key
    np.testing.assert_array_equal(out["nd"], batch["nd"])
    assert out["rec"].dtype == batch["rec"].dtype
    assert out["meta"] == batch["meta"]
    assert payload_len < 1200  # descriptors only: the 1 KiB of tensor data did not travel


def test_strides_of_permuted_tensors_are_kept_and_slices_are_compacted(link):
    pool, reader, _ = link
    permuted = torch.randn(3, 4, 5).permute(2, 0, 1)
    sliced = torch.randn(10, 10)[::2, 1:4]
    out, _, _ = roundtrip(pool, reader, (permuted, sliced))
    assert out[0].stride() == permuted.stride() and torch.equal(out[0], permuted)
    assert out[1].is_contiguous() and torch.equal(out[1], sliced)


def test_requires_grad_leaf_keeps_the_flag(link):
    pool, reader, _ = link
    t = torch.randn(3, requires_grad=True)
    out, _, _ = roundtrip(pool, reader, [t])
    assert out[0].requires_grad and torch.equal(out[0].detach(), t.detach())


def test_collated_batch_is_born_in_the_slab_and_not_copied_twice(link):
    pool, reader, _ = link
    samples = [{"x": torch.full((64,), float(i)), "y": i} for i in range(256)]
    out, _, _ = roundtrip(pool, reader, samples, collate=True)
    expected = torch.utils.data.default_collate(samples)
    assert torch.equal(out["x"], expected["x"]) and torch.equal(out["y"], expected["y"])


def test_a_batch_without_tensors_gives_its_slab_back_at_once(link):
    pool, reader, created = link
    out, sid, _ = roundtrip(pool, reader, ["only", "strings"])
    assert out == ["only", "strings"] and sid is None
    _, sid2, _ = roundtrip(pool, reader, [torch.ones(3)])
    assert created == [sid2]


def test_released_slab_is_reused_and_held_batches_stay_valid(link):
    pool, reader, created = link
    first, sid1, _ = roundtrip(pool, reader, [torch.full((100,), 1.0)])
    held, sid2, _ = roundtrip(pool, reader, [torch.full((100,), 2.0)])
    assert sid1 != sid2  # sid1 is still held by `first`
    del first
    recycle(pool, reader)
    again, sid3, _ = roundtrip(pool, reader, [torch.full((100,), 3.0)])
    assert sid3 == sid1 and len(created) == 2
    assert torch.equal(held[0], torch.full((100,), 2.0))  # not overwritten
    assert torch.equal(again[0], torch.full((100,), 3.0))


def test_a_view_kept_after_the_batch_is_dropped_keeps_the_slab(link):
    pool, reader, created = link
    batch, sid, _ = roundtrip(pool, reader, {"x": torch.arange(100_000.0)})  # 400 KB: a view
    view = batch["x"][10:20].numpy()
    del batch
    recycle(pool, reader)
    _, sid2, _ = roundtrip(pool, reader, {"x": torch.zeros(100_000)})
    assert sid2 != sid
    np.testing.assert_array_equal(view, np.arange(10.0, 20.0))


def test_small_leaves_are_copied_out_and_do_not_keep_the_slab(link):
    # NOTE [ Small leaves do not hold the slab ]: labels kept, images dropped.
    pool, reader, _ = link
    images = torch.arange(300_000, dtype=torch.uint8).reshape(100, 3000)
    batch, sid, _ = roundtrip(pool, reader, {"images": images, "labels": torch.arange(100)})
    labels = batch["labels"]
    assert torch.equal(batch["images"], images) and labels.tolist() == list(range(100))
    del batch
    recycle(pool, reader)
    _, sid2, _ = roundtrip(pool, reader, {"images": images, "labels": torch.arange(100)})
    assert sid2 == sid  # the slab came back although the labels are still held
    assert labels.tolist() == list(range(100))


def test_batch_larger_than_the_slab_moves_to_a_bigger_one(link):
    pool, reader, _ = link
    small, _, _ = roundtrip(pool, reader, [torch.ones(10)])
    big = torch.randn(1 << 20)  # 4 MiB, far above the first slab
    out, _, _ = roundtrip(pool, reader, [big, torch.ones(3)])
    assert torch.equal(out[0], big)


def test_idle_slabs_beyond_the_cap_are_retired(link):
    pool, reader, _ = link
    held = [roundtrip(pool, reader, [torch.ones(10)])[0] for _ in range(5)]
    del held
    gc.collect()
    retired = []
    for _, ids in reader.take_released().items():
        retired += pool.release(ids)
    assert len(retired) == 3  # five free, cap two
    reader.retire(0, retired)


# -- NOTE [ Slabs outlive workers ] ----------------------------------------------------------


def _slab_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("stoker-slab" in line for line in f)


def test_a_slab_leased_when_the_workers_stop_is_banked_only_once_released(link, monkeypatch):
    monkeypatch.setattr(slab_reader, "SMALL_LEAF_BYTES", 0)  # a view of the slab, not a copy
    pool, reader, _ = link
    held, _, _ = roundtrip(pool, reader, [torch.full((256,), 3.0)])
    bank = SlabBank()
    pool.close()
    reader.close(bank)
    assert bank.nbytes == 0  # the user still reads it
    assert torch.equal(held[0], torch.full((256,), 3.0))
    del held
    gc.collect()
    assert bank.nbytes > 0
    bank.close()
    assert _slab_mappings() == 0


def test_the_bank_frees_what_exceeds_its_cap_and_what_comes_after_close():
    def mapped(nbytes):
        fd, ref = segments.create(0, nbytes)
        address = segments.map_address(fd, ref.nbytes)
        segments.close(fd)
        return BankedSlab(address, ref.nbytes)

    bank = SlabBank(max_bytes=3 << 16)
    bank.deposit(0, mapped(1 << 16))
    bank.deposit(1, mapped(1 << 16))
    bank.deposit(1, mapped(1 << 17))  # over the cap: freed at once
    assert bank.nbytes == 2 << 16 and _slab_mappings() == 2
    taken = bank.withdraw(1)
    assert [s.nbytes for s in taken] == [1 << 16]
    bank.close()
    assert _slab_mappings() == 1  # the withdrawn one belongs to its taker
    bank.deposit(0, mapped(1 << 16))  # a lease released after the loader is gone
    assert bank.nbytes == 0 and _slab_mappings() == 1
    segments.unmap_address(taken[0].address, taken[0].nbytes)
    assert _slab_mappings() == 0


def test_a_batch_sent_torchs_way_is_freed_without_the_cyclic_collector() -> None:
    """NOTE [ No cycle through the pickler ] (transport/torch_way.py): once ``dumps`` has
    returned and the worker drops the batch, nothing holds it, its storage's shared memory
    included; with the pickler in a cycle its memo kept both until the collector ran."""
    import weakref

    from stoker.transport import torch_way

    batch = {"x": torch.ones(4, 256), "y": [torch.arange(3)]}
    refs = [weakref.ref(batch["x"]), weakref.ref(batch["y"][0])]
    gc.disable()
    try:
        payload, fds, nbytes = torch_way.dumps(batch)
        torch_way.close(fds)
        assert nbytes == 4 * 256 * 4 + 3 * 8 + len(payload)
        del batch
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


def test_encoded_bytes_go_through_the_slab_and_arrive_as_the_same_bytes(link):
    """NOTE [ Encoded bytes through the slab ]: large bytes leave the message, arrive as equal
    bytes objects (one object where the batch had one, twice), and do not hold the slab."""
    pool, reader, _ = link
    rng = np.random.default_rng(0)
    jpegs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (5000, 70_000, 4096)]
    small = b"\xff\xd8tiny"
    batch = ([jpegs[0], jpegs[1], jpegs[0], small, jpegs[2]], torch.arange(5))
    out, sid, payload_len = roundtrip(pool, reader, batch)
    assert sid is not None and payload_len < 1000  # 79 KB of bytes, not in the message
    items, labels = out
    assert [type(b) for b in items] == [bytes] * 5
    assert items == batch[0] and torch.equal(labels, batch[1])
    assert items[0] is items[2]  # one object, as pickle's memo would give
    del out, items, labels
    gc.collect()
    assert reader.take_released() == {0: [sid]}  # the bytes are copies: the slab is free
    # A batch of bytes alone gets a slab too, sized for them.
    out, sid, payload_len = roundtrip(pool, reader, [jpegs[1]] * 3)
    assert sid is not None and payload_len < 200 and out == [jpegs[1]] * 3
