"""Batches from workers cross as torch's do by default (NOTE [ Batches cross as torch's do ]).

Each check runs torch's DataLoader and stoker's on the same dataset and compares what a program
can read off the tensors: shared memory, strides, storage offsets, whole storages of views,
aliasing between leaves and between batches.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset

import stoker


class _Table(Dataset):
    """Samples are views of one table: rows, columns, and the table itself."""

    def __init__(self) -> None:
        self.table = torch.arange(48, dtype=torch.float32).view(4, 12)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.table[i]
        return {"row": row, "col": self.table[:, i], "same": (row, row, row[2:]),
                "table": self.table}


def _layout(t: torch.Tensor) -> tuple:
    return (t.is_shared(), t.storage_offset(), tuple(t.stride()), t.untyped_storage().nbytes(),
            t.is_contiguous(), t.tolist())


def _describe(batches: list[dict[str, Any]]) -> list[tuple]:
    out = []
    for b in batches:
        same = b["same"]
        out.append((
            _layout(b["row"]), _layout(b["col"]), _layout(b["table"]),
            same[0] is same[1],
            same[2].untyped_storage().data_ptr() == same[0].untyped_storage().data_ptr(),
        ))
    # the whole table, sent in every batch from one worker: one storage in the main process
    ptrs = [b["table"].untyped_storage().data_ptr() for b in batches]
    out.append(tuple(ptrs[i] == ptrs[j] for i in range(len(ptrs)) for j in range(i)))
    return out


def _load(loader_class: type, **kwargs: Any) -> list:
    return list(loader_class(_Table(), batch_size=None, num_workers=1, timeout=60, **kwargs))


def test_uncollated_views_keep_torchs_layout_and_aliasing():
    expected = _describe(_load(TorchLoader))
    assert expected[0][0][:4] == (True, 0, (1,), 192)  # a row: the whole table's storage
    assert expected[-1] and all(expected[-1])  # one storage across batches, under torch
    assert _describe(_load(stoker.DataLoader)) == expected


def test_slab_transport_sends_compact_copies():
    batches = _load(stoker.DataLoader, beyond_torch={"slab_transport"})
    row = batches[1]["row"]
    assert (row.is_shared(), row.storage_offset(), row.untyped_storage().nbytes()) == (
        False, 0, 48)
    assert row.tolist() == _Table()[1]["row"].tolist()


def test_collated_batches_are_in_shared_memory_as_torchs():
    data = torch.utils.data.TensorDataset(torch.arange(40.0).view(20, 2), torch.arange(20))

    def describe(loader_class: type) -> list:
        return [(_layout(x), _layout(y)) for x, y in loader_class(
            data, batch_size=6, num_workers=2, timeout=60)]

    expected = describe(TorchLoader)
    assert all(x[0] and y[0] for x, y in expected)  # is_shared
    assert describe(stoker.DataLoader) == expected


class _ManyLeaves(Dataset):
    """More separate storages in one batch than one socket message passes (250 fds)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> list[torch.Tensor]:
        return [torch.full((3,), float(i * 1000 + k)) for k in range(600)]


def test_a_batch_with_hundreds_of_storages_arrives_whole():
    batches = list(stoker.DataLoader(_ManyLeaves(), batch_size=None, num_workers=2,
                                     timeout=60))
    for i, batch in enumerate(batches):
        assert len(batch) == 600
        assert all(t.is_shared() for t in batch)
        assert [t[0].item() for t in batch] == [float(i * 1000 + k) for k in range(600)]
