"""Native thread pools in workers: torch's settings by default (``thread_caps`` caps them),
no deadlock after the parent used them."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing

import numpy as np
import pytest
import torch

import stoker

cv2 = pytest.importorskip("cv2")
threadpool_info = pytest.importorskip("threadpoolctl").threadpool_info


class Resize(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        image = np.full((512, 512, 3), i, dtype=np.uint8)
        out = cv2.resize(image, (300, 300), interpolation=cv2.INTER_LINEAR)
        blas = [p["num_threads"] for p in threadpool_info() if p["internal_api"] == "openblas"]
        return torch.tensor(
            [cv2.getNumThreads(), torch.get_num_threads(), int(out[0, 0, 0]), max(blas or [1])]
        )


def _parent_blas_threads():
    return [p["num_threads"] for p in threadpool_info() if p["internal_api"] == "openblas"]


def test_workers_resize_with_opencv_after_the_parent_used_its_thread_pool():
    parent_threads = cv2.getNumThreads()
    parent_blas = _parent_blas_threads()
    cv2.setNumThreads(4)
    try:
        big = np.random.randint(0, 255, (2048, 2048, 3), dtype=np.uint8)
        cv2.resize(big, (1024, 1024))  # starts OpenCV's pool in the parent before the fork
        loader = stoker.DataLoader(Resize(), batch_size=2, num_workers=2, timeout=60)
        rows = torch.cat(list(loader))
        # the count torch's worker reads, in a pool made fresh in the worker (not the
        # inherited one that can deadlock it)
        assert rows[:, 0].tolist() == [4] * 8
        assert rows[:, 1].tolist() == [1] * 8  # torch intra-op capped, as torch does
        assert rows[:, 2].tolist() == list(range(8))
        torchs = torch.cat(list(torch.utils.data.DataLoader(Resize(), batch_size=2,
                                                             num_workers=2, timeout=60)))
        assert rows[:, 3].tolist() == torchs[:, 3].tolist()  # numpy's OpenBLAS: torch's
        capped = stoker.DataLoader(Resize(), batch_size=2, num_workers=2, timeout=60,
                                   beyond_torch={"thread_caps"})
        capped_rows = torch.cat(list(capped))
        assert capped_rows[:, 3].tolist() == [1] * 8  # beyond torch: capped
        assert capped_rows[:, 0].tolist() == [1] * 8  # OpenCV too
        assert cv2.getNumThreads() == 4  # the parent's setting is untouched
        assert _parent_blas_threads() == parent_blas  # the parent's OpenBLAS is not touched
    finally:
        cv2.setNumThreads(parent_threads)


def _openblas_pool_built():
    """numpy's OpenBLAS: is its thread pool built (``blas_server_avail``)? None if unknown."""
    from stoker.workers.thread_caps import pool_setters

    for pool in pool_setters():
        if pool.blas_count is not None:
            lib = ctypes.CDLL(pool.name if "/" in pool.name else _library_path(pool.name))
            with contextlib.suppress(ValueError):
                return ctypes.c_int.in_dll(lib, "blas_server_avail").value
    return None


def _library_path(name):
    with open("/proc/self/maps") as f:
        return next(line.split()[5] for line in f if line.rstrip().endswith(name))


class BlasPoolState(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor([_openblas_pool_built(), int(np.ones((64, 64)).dot(np.ones(64))[0])])


def _after_a_bare_fork():
    """What a plain fork does to OpenBLAS's pool, in the parent and in the child."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    child = ctx.Process(target=lambda: queue.put(_openblas_pool_built()))
    child.start()
    child.join(60)
    return _openblas_pool_built(), queue.get()


def test_forked_workers_leave_openblas_pools_as_a_bare_fork_does():
    # NOTE [ OpenBLAS after fork ]: neither the parent nor a worker rebuilds the pool (its new
    # threads would spin ~0.1 s), yet the worker counts one thread and its BLAS calls work.
    np.ones((64, 64)).dot(np.ones((64, 64)))  # the parent's pool is in use
    if _openblas_pool_built() is None:
        pytest.skip("this OpenBLAS does not export blas_server_avail")
    parent_after_fork, child_after_fork = _after_a_bare_fork()
    loader = stoker.DataLoader(BlasPoolState(), batch_size=2, num_workers=2, timeout=60)
    rows = torch.cat(list(loader))
    assert rows[:, 0].tolist() == [child_after_fork] * 4
    assert rows[:, 1].tolist() == [64] * 4
    assert _openblas_pool_built() == parent_after_fork
