"""NOTE [ Slabs outlive workers ]: a banked slab is written by a forked child through the
mapping it inherited, and read back here through the bank's mapping (a real fork)."""

from __future__ import annotations

import gc
import multiprocessing
import os

import pytest
import torch

from stoker.collate import allocating_into, default_collate
from stoker.transport import segments, slab_reader
from stoker.transport.slab_bank import SlabBank
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


def _slab_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("stoker-slab" in line for line in f)


def _write_in_forked_child(inherited, value: float):
    """What a forked worker does: collate into an inherited slab, send (sid, used, payload)."""
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()

    def child():
        announced = []
        pool = SlabPool(lambda fd, ref: announced.append(ref), max_idle=2, inherited=inherited)
        slab = pool.acquire(1 << 10)
        with allocating_into(slab):
            batch = default_collate([torch.full((64,), value) for _ in range(4)])
        child_end.send((write_batch(pool, slab, batch), announced))
        pool.close()

    proc = ctx.Process(target=child)
    proc.start()
    try:
        assert parent_end.poll(30), "the child did not answer"
        return parent_end.recv()
    finally:
        proc.join(30)
        assert proc.exitcode == 0


def test_a_banked_slab_is_written_by_a_forked_child_through_the_inherited_mapping(
    link, monkeypatch
):
    # Small batches read as views of the slab here (NOTE [ Small leaves do not hold the slab ]).
    monkeypatch.setattr(slab_reader, "SMALL_LEAF_BYTES", 0)
    pool, reader, created = link
    first, sid, _ = roundtrip(pool, reader, [torch.ones(256)])
    del first
    gc.collect()
    bank = SlabBank()
    pool.close()
    reader.close(bank)  # the worker side is gone; the main process's mapping goes to the bank
    assert bank.nbytes > 0 and _slab_mappings() == 1
    slabs = bank.withdraw(0)
    assert len(slabs) == 1 and bank.nbytes == 0
    reader2 = SlabReader()
    reader2.adopt_banked(0, 0, slabs[0])
    (sid2, used, payload), announced = _write_in_forked_child(
        tuple((s.address, s.nbytes) for s in slabs), 7.0
    )
    assert sid2 == 0 and announced == []  # the inherited slab: no new segment
    out = reader2.unpack(0, sid2, used, payload)
    assert torch.equal(out, torch.full((4, 64), 7.0))
    assert out.data_ptr() == slabs[0].address  # read through the banked mapping, not a new one
    del out
    gc.collect()
    reader2.close(bank)  # released: back to the bank
    assert len(bank.withdraw(0)) == 1
    assert _slab_mappings() == 1  # withdrawn but not freed: the caller owns it now
    for s in slabs:
        segments.unmap_address(s.address, s.nbytes)
    assert _slab_mappings() == 0
