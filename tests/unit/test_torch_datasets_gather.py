"""NOTE [ torch's own datasets ]: the gathers give ``default_collate`` of torch's own fetch, and
decline (the batch goes sample by sample) wherever that cannot be shown."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, StackDataset, Subset, TensorDataset, default_collate
from torch.utils.data._utils import collate as torch_collate

import stoker
from _tensor_layout import tensor_layout
from stoker._core.specs import FetchSpec
from stoker.fastpaths.batched_columns import Decline
from stoker.fastpaths.torch_datasets import allowed, batched_for
from stoker.fastpaths.torch_gather import gather, torch_calls_stock


def _x(n: int = 10, *row: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.arange(n * int(np.prod(row or (1,)))) + 1).reshape(n, *row).to(dtype)


def _torch_batch(ds: Any, idx: list[int]) -> Any:
    getitems = getattr(ds, "__getitems__", None)
    return default_collate(getitems(idx) if getitems else [ds[i] for i in idx])


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.shape, a.stride(), a.storage_offset()) == (
            b.dtype, b.shape, b.stride(), b.storage_offset()) and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b, strict=True))


DATASETS = {
    "tensors": lambda: TensorDataset(_x(10, 3), _x(10, dtype=torch.int64),
                                     _x(10, 2, 0, dtype=torch.bool)),
    "bare": lambda: _x(10, 2, dtype=torch.complex64),
    "stack": lambda: StackDataset(TensorDataset(_x(10)), _x(10, dtype=torch.bfloat16)),
    "stack_dict": lambda: StackDataset(img=_x(10, 2, 2), y=TensorDataset(_x(10), _x(10))),
    "subset": lambda: Subset(TensorDataset(_x(20, 2)), [19, 0, 5, 5, 3, 2, 1, 7, 8, 9]),
    "concat": lambda: ConcatDataset([TensorDataset(_x(4, 2)), TensorDataset(_x(0, 2)),
                                     TensorDataset(_x(6, 2) * 7)]),
    "nested": lambda: Subset(ConcatDataset([StackDataset(a=_x(3), b=_x(3, 2)),
                                            StackDataset(a=_x(9) + 5, b=_x(9, 2) - 1)]),
                             range(11, -1, -1)),
    "offset": lambda: TensorDataset(_x(11, 3)[1:]),
}


@pytest.mark.parametrize("name", sorted(DATASETS))
@pytest.mark.parametrize("idx", [[0], [9, 0, 3, 3, 7], list(range(10))])
def test_gather_is_torchs_batch(name: str, idx: list[int]) -> None:
    ds = DATASETS[name]()
    assert _same(gather(ds, idx), _torch_batch(ds, idx))


def _leaves(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    values = batch.values() if isinstance(batch, dict) else batch
    return [leaf for value in values for leaf in _leaves(value)]


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_in_a_worker_the_gather_allocates_as_torchs_collate(name: str) -> None:
    """In a worker torch's ``collate_tensor_fn`` stacks into new shared memory; the gather's
    outputs have that storage and layout (shared, exactly the batch's bytes, offset 0)."""
    from torch.utils.data._utils import worker as torch_worker

    ds, idx = DATASETS[name](), [9, 0, 3, 3, 7]
    torch_worker._worker_info = torch_worker.WorkerInfo(id=0, num_workers=1, seed=0,
                                                        dataset=ds)
    try:
        ours, theirs = gather(ds, idx), _torch_batch(ds, idx)
    finally:
        torch_worker._worker_info = None
    assert _same(ours, theirs)
    assert [tensor_layout(t) for t in _leaves(ours)] == [
        tensor_layout(t) for t in _leaves(theirs)]
    assert all(t.is_shared() for t in _leaves(ours))


class MyTensorDataset(TensorDataset):
    pass


@pytest.mark.parametrize("case", [
    "negative", "numpy_int", "bool", "out_of_range", "tuple_batch", "empty", "noncontiguous",
    "requires_grad", "parameter", "subclass", "subset_tensor_indices", "subset_negative",
    "concat_dtypes", "concat_structure", "mode", "getitems_on_instance",
])
def test_declines(case: str) -> None:
    ds: Any = TensorDataset(_x(10, 2), _x(10))
    idx: Any = [1, 2]
    if case == "negative":
        idx = [1, -1]
    elif case == "numpy_int":
        idx = [1, np.int64(2)]
    elif case == "bool":
        idx = [1, True]
    elif case == "out_of_range":
        idx = [1, 10]
    elif case == "tuple_batch":
        idx = (1, 2)
    elif case == "empty":
        idx = []
    elif case == "noncontiguous":
        ds = TensorDataset(_x(10, 2).t().contiguous().t())
    elif case == "requires_grad":
        ds = TensorDataset(_x(10, 2).requires_grad_())
    elif case == "parameter":
        ds = TensorDataset(torch.nn.Parameter(_x(10, 2), requires_grad=False))
    elif case == "subclass":
        ds = MyTensorDataset(_x(10, 2))
    elif case == "subset_tensor_indices":
        ds = Subset(ds, torch.arange(10))
    elif case == "subset_negative":
        ds = Subset(ds, [0, 1, -1])
    elif case == "concat_dtypes":
        ds, idx = ConcatDataset([TensorDataset(_x(2)), TensorDataset(_x(2).double())]), [0, 3]
    elif case == "concat_structure":
        ds, idx = ConcatDataset([TensorDataset(_x(2)), TensorDataset(_x(2), _x(2))]), [0, 3]
    elif case == "getitems_on_instance":
        ds.__getitems__ = lambda indices: [ds[i] for i in indices]
    if case == "mode":
        with torch.device("meta"), pytest.raises(Decline):
            gather(ds, idx)
        return
    with pytest.raises(Decline):
        gather(ds, idx)


def test_a_patched_class_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = TensorDataset(_x(10, 2))
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: (self.tensors[0][i] * 2,))
    with pytest.raises(Decline):
        gather(ds, [0, 1])


def _wrapped(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return wrapper


@pytest.mark.parametrize(("owner", "name"), [
    (torch, "stack"), (torch.Tensor, "__getitem__"), (torch.Tensor, "new"),
    (torch.Tensor, "resize_"), (torch.Tensor, "_typed_storage"),
    (torch.TypedStorage, "_new_shared"), (torch_collate, "collate"),
])
def test_a_function_torchs_path_calls_rebound_declines(
        monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
    # even a wrapper that changes nothing: what it does is the program's, called by torch
    ds = TensorDataset(_x(10, 2))
    assert torch_calls_stock()
    gather(ds, [0, 1])
    monkeypatch.setattr(owner, name, _wrapped(getattr(owner, name)))
    assert not torch_calls_stock()
    with pytest.raises(Decline):
        gather(ds, [0, 1])
    monkeypatch.undo()
    assert torch_calls_stock()


def _spec(ds: Any, collate_fn: Any = default_collate, **kw: Any) -> FetchSpec:
    return FetchSpec(dataset=ds, kind="map", auto_collation=True, collate_fn=collate_fn,
                     drop_last=False, **kw)


def test_allowed_only_with_the_default_collate_and_no_worker_init_fn() -> None:
    ds = TensorDataset(_x(10, 2))
    assert allowed(_spec(ds), None)
    assert allowed(_spec(ds, stoker.default_collate), None)
    assert not allowed(_spec(ds), print)  # a worker_init_fn
    assert not allowed(_spec(ds, lambda b: default_collate(b)), None)
    assert not allowed(_spec(ds, fast_paths=False), None)
    assert not allowed(_spec(ds, skip_errors=True), None)
    assert not allowed(_spec(MyTensorDataset(_x(10, 2))), None)
    assert not allowed(_spec(Subset(MyTensorDataset(_x(10, 2)), [0])), None)


def test_a_changed_collate_map_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    fetch = batched_for(_spec(TensorDataset(_x(10, 2))), None)
    assert fetch is not None and _same(fetch([0, 1]), [_x(10, 2)[:2]])
    monkeypatch.setitem(torch_collate.default_collate_fn_map, tuple, lambda b, **kw: "mine")
    with pytest.raises(Decline):
        fetch([0, 1])


def test_loader_gathers_by_default_and_says_so_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    ds = StackDataset(x=_x(40, 3), y=Subset(TensorDataset(_x(50)), list(range(40))))
    expected = list(torch.utils.data.DataLoader(ds, batch_size=8))
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        loader = stoker.DataLoader(ds, batch_size=8)
        got = list(loader)
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    assert loader.stats().batched == 5
    # at most the one DEBUG line (once per process and class): nothing a program shows
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)
    off = stoker.DataLoader(ds, batch_size=8, fast_paths=False)
    assert all(_same(a, b) for a, b in zip(off, expected, strict=True))
    assert off.stats().batched == 0
