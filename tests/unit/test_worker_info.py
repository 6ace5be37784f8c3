"""``get_worker_info()`` inside stoker's workers is torch's own ``WorkerInfo``, of torch's type
(issue 44: a subclass with rank fields changed its repr, type name and ``dataclasses.fields``),
built on torch 2.13 (a frozen dataclass) and on earlier torch (a keyword class, read-only once
built; the CUDA machines ship 2.11)."""

from __future__ import annotations

import dataclasses
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


@pytest.fixture
def restore_worker_info():
    before = torch_worker._worker_info
    yield
    torch_worker._worker_info = before


@pytest.mark.parametrize("base", [torch_worker.WorkerInfo, KeywordWorkerInfo],
                         ids=["torch-installed", "torch-before-2.13"])
def test_both_shapes_are_set_as_torch_sets_them(base, restore_worker_info, monkeypatch):
    monkeypatch.setattr(torch_worker, "WorkerInfo", base)
    worker_info.set_worker_info(1, 4, 7, "ds")
    info = torch.utils.data.get_worker_info()
    assert type(info) is base
    assert (info.id, info.num_workers, info.seed, info.dataset) == (1, 4, 7, "ds")
    with pytest.raises((AttributeError, RuntimeError)):
        info.id = 0


def test_the_record_is_torchs_own_type_fields_and_repr(restore_worker_info):
    worker_info.set_worker_info(3, 4, 11, [1, 2])
    info = torch.utils.data.get_worker_info()
    assert info is worker_info.get_worker_info()
    expected = torch_worker.WorkerInfo(id=3, num_workers=4, seed=11, dataset=[1, 2])
    assert type(info) is torch_worker.WorkerInfo
    assert repr(info) == repr(expected)
    assert dataclasses.fields(info) == dataclasses.fields(expected)
    assert dataclasses.asdict(info) == dataclasses.asdict(expected)
    assert type(pickle.loads(pickle.dumps(info))) is torch_worker.WorkerInfo
