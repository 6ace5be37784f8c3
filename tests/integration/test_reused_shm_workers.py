"""torch's shared memory, reused, with real workers (NOTE [ torch's shared memory, reused ]):
later batches are written into the segments of earlier ones only once nothing can see them,
here or in another process."""

from __future__ import annotations

import multiprocessing
import multiprocessing.resource_sharer
from typing import Any

import pytest
import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, TensorDataset

import stoker
from stoker.transport import reused_shm

TIMEOUT_S = 120


class _Rows(Dataset):
    def __init__(self, n: int = 96) -> None:
        self.x = torch.arange(n * 6, dtype=torch.float32).view(n, 6)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i].clone(), "y": i}


def _values(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _values(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_values(v) for v in batch]
    return (batch.is_shared(), batch.untyped_storage().nbytes(), batch.tolist())


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(5)


@pytest.mark.parametrize("dataset", [_Rows(), TensorDataset(_Rows().x, torch.arange(96))],
                         ids=["dicts", "TensorDataset"])
@pytest.mark.parametrize("persistent", [False, True])
def test_batches_kept_for_two_epochs_keep_torchs_values(dataset, persistent):
    kwargs: dict[str, Any] = dict(batch_size=8, shuffle=True, num_workers=2, timeout=TIMEOUT_S,
                                  persistent_workers=persistent)
    expected = [_values(b) for b in TorchLoader(dataset, generator=_gen(), **kwargs)]
    loader = stoker.DataLoader(dataset, generator=_gen(), **kwargs)
    kept = list(loader)  # every batch held while later ones arrive
    assert [_values(b) for b in kept] == expected
    again = [_values(b) for b in loader]  # an epoch whose batches are dropped at once
    assert len(again) == len(expected)
    assert [_values(b) for b in kept] == expected


def test_later_batches_reuse_the_segments_of_earlier_ones(monkeypatch):
    fd_less = []
    rebuild = reused_shm.MainSegments.rebuild

    def counting(self: Any, seg_id: int, nbytes: int, fd: int | None) -> Any:
        fd_less.append(fd is None)
        return rebuild(self, seg_id, nbytes, fd)

    monkeypatch.setattr(reused_shm.MainSegments, "rebuild", counting)
    loader = stoker.DataLoader(_Rows(), batch_size=8, num_workers=1, timeout=TIMEOUT_S)
    for batch in loader:
        assert batch["x"].is_shared()
    assert len(fd_less) == 24  # two leaves in each of 12 batches
    assert sum(fd_less) >= 12  # most arrived in segments the main process had mapped


def _let_go(child: Any, go: Any) -> None:
    """Release a test's child and wait for it; kill it if it does not end."""
    go.set()
    child.join(TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join(TIMEOUT_S)


def _read_later(queue: Any, go: Any, out: Any) -> None:
    batch = queue.get(timeout=TIMEOUT_S)
    out.put("received")
    go.wait(TIMEOUT_S)
    out.put(batch["x"].tolist())


def test_a_batch_sent_to_another_process_is_not_overwritten():
    ctx = tmp.get_context("fork")
    queue, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_read_later, args=(queue, go, out))
    child.start()
    try:
        loader = stoker.DataLoader(_Rows(), batch_size=8, num_workers=1, timeout=TIMEOUT_S)
        it = iter(loader)
        first = next(it)
        sent = first["x"].tolist()
        queue.put(first)
        assert out.get(timeout=TIMEOUT_S) == "received"  # the child maps it now
        del first
        rest = [b["x"].tolist() for b in it]  # later batches, dropped at once
        assert len(rest) == 11 and sent not in rest
        go.set()
        assert out.get(timeout=TIMEOUT_S) == sent
    finally:
        _let_go(child, go)
        multiprocessing.resource_sharer.stop(TIMEOUT_S)  # the thread torch's send started
    assert child.exitcode == 0


def _compare_later(batch: Any, go: Any, out: Any) -> None:
    go.wait(TIMEOUT_S)
    out.put(batch["x"].tolist())


def test_a_batch_a_forked_child_inherited_is_not_overwritten():
    ctx = multiprocessing.get_context("fork")
    out, go = ctx.Queue(), ctx.Event()
    loader = stoker.DataLoader(_Rows(), batch_size=8, num_workers=1, timeout=TIMEOUT_S)
    it = iter(loader)
    first = next(it)
    seen = first["x"].tolist()
    child = ctx.Process(target=_compare_later, args=(first, go, out))
    child.start()
    try:
        del first
        assert sum(1 for _ in it) == 11  # later batches, dropped at once
        go.set()
        assert out.get(timeout=TIMEOUT_S) == seen
    finally:
        _let_go(child, go)
    assert child.exitcode == 0


def test_between_epochs_persistent_workers_keep_only_what_the_user_holds():
    loader = stoker.DataLoader(_Rows(), batch_size=8, num_workers=1, timeout=TIMEOUT_S,
                               persistent_workers=True)
    kept: Any = None
    for batch in loader:
        kept = batch
    del batch
    group = loader._iterator._group
    table = group.workers[0].reused._table
    held = {kept["x"].untyped_storage().data_ptr(), kept["y"].untyped_storage().data_ptr()}
    assert {entry.ptr for entry in table.values()} == held  # only the last batch's, held
    assert [b["x"].tolist() for b in loader] == [b["x"].tolist() for b in loader]
