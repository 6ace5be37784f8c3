"""DecodeImages used in a process forked after its thread pool started (a worker calling it in
``__getitem__``): the pool's threads did not come along, so the child starts its own instead of
queuing work that never runs (a real fork)."""

from __future__ import annotations

import io
import multiprocessing

import numpy as np
import torch
from PIL import Image

from stoker.device import feed
from stoker.image import DecodeImages

HANG_GUARD_S = 240  # a child that never answers fails here, not the whole run


def _jpeg(seed: int) -> bytes:
    coarse = np.random.default_rng(seed).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(coarse).resize((50, 40), Image.BICUBIC).save(buf, format="JPEG")
    return buf.getvalue()


def test_a_forked_child_decodes_with_threads_of_its_own() -> None:
    jpegs = [_jpeg(k) for k in range(8)]
    decode = DecodeImages(size=16, decode_on="cpu")
    feed._BATCH.seed = 5  # the crops of a batch with seed 5, here and in the child
    try:
        here = decode(jpegs)  # the pool's threads start in this process
        _in_a_forked_child(decode, jpegs, here)
    finally:
        feed._BATCH.seed = None


def _in_a_forked_child(decode: DecodeImages, jpegs: list[bytes], here: torch.Tensor) -> None:
    assert decode._pool is not None and len(decode._pool._threads) >= 1
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe()

    def child() -> None:
        torch.set_num_threads(1)  # as torch's worker loop does (OpenMP does not survive fork)
        child_end.send(decode(jpegs).numpy().tobytes())

    proc = ctx.Process(target=child)
    proc.start()
    answered = False
    try:
        answered = parent_end.poll(HANG_GUARD_S)
        assert answered, "the forked child's decode never finished (a pool without threads)"
        assert parent_end.recv() == here.numpy().tobytes()
    finally:
        if not answered:
            proc.kill()
        proc.join(HANG_GUARD_S)  # it answered: it is exiting
    assert proc.exitcode == 0
    assert not multiprocessing.active_children()
