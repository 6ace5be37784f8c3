"""Native thread pools in workers: capped, no deadlock after the parent used them."""

from __future__ import annotations

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
        assert rows[:, 0].tolist() == [1] * 8  # OpenCV capped in the worker
        assert rows[:, 1].tolist() == [1] * 8  # torch intra-op capped
        assert rows[:, 2].tolist() == list(range(8))
        assert rows[:, 3].tolist() == [1] * 8  # numpy's OpenBLAS capped too
        assert cv2.getNumThreads() == 4  # the parent's setting is untouched
        # OpenBLAS counts one thread only while the workers are forked (they inherit it)
        assert _parent_blas_threads() == parent_blas
    finally:
        cv2.setNumThreads(parent_threads)
