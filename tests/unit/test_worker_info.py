"""``get_worker_info()`` inside stoker's workers is torch's ``WorkerInfo`` with rank and
world_size added, on torch 2.13 (a frozen dataclass) and on earlier torch (a keyword class,
read-only once built; the CUDA machines ship 2.11, where stoker's workers died at start)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch.utils.data
from torch.utils.data._utils import worker as torch_worker

from stoker.workers import worker_info


class KeywordWorkerInfo:
    """The shape of torch < 2.13's WorkerInfo: keywords become attributes, then it freezes."""

    _initialized = False

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._initialized = True

    def __setattr__(self, key: str, val: Any) -> None:
        if self._initialized:
            raise RuntimeError(f"Cannot assign attributes to {type(self).__name__} objects")
        super().__setattr__(key, val)


@pytest.mark.parametrize("base", [torch_worker.WorkerInfo, KeywordWorkerInfo],
                         ids=["torch-installed", "torch-before-2.13"])
def test_both_shapes_carry_the_rank_and_stay_read_only(base):
    cls = worker_info.worker_info_class(base)
    info = cls(id=1, num_workers=4, seed=7, dataset="ds", rank=2, world_size=3)
    assert isinstance(info, base)
    assert (info.id, info.num_workers, info.seed, info.dataset) == (1, 4, 7, "ds")
    assert (info.shard_id, info.num_shards) == (2 * 4 + 1, 12)
    with pytest.raises((AttributeError, RuntimeError)):
        info.id = 0
    alone = cls(id=0, num_workers=2, seed=0, dataset=None)
    assert (alone.rank, alone.world_size, alone.shard_id) == (0, 1, 0)


def test_set_worker_info_is_what_torch_get_worker_info_returns():
    before = torch_worker._worker_info
    try:
        worker_info.set_worker_info(3, 4, 11, [1, 2], rank=1, world_size=2)
        info = torch.utils.data.get_worker_info()
        assert info is worker_info.get_worker_info()
        assert (info.id, info.seed, info.shard_id, info.num_shards) == (3, 11, 7, 8)
        again = pickle.loads(pickle.dumps(info))
        assert type(again).__name__ == "StokerWorkerInfo" and again.shard_id == 7
    finally:
        torch_worker._worker_info = before
