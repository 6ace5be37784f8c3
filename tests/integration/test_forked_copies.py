"""A process forked while stoker objects are alive leaves them to their owner (NOTE [ A forked
child leaves its parent's things alone ]): when the child's collector frees its copy of an
iterator, nothing reaches the parent's workers.

The test forks a child that drops its copy and runs a full collection, then finishes the
parent's epoch and compares it with torch's. Before the fix the child's copy asked the parent's
workers to stop (the parent's epoch then failed: WorkerDiedError) and waited 5 s per iterator
for processes that were not its children.
"""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any

import torch

import stoker

JOIN_S = 60


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((8,), i * i)


def _drop_and_collect(holder: list[Any]) -> None:
    holder.clear()  # the child's copy of the parent's iterator (or batch) is garbage now
    gc.collect()


def _fork_a_child_that_drops(holder: list[Any]) -> int | None:
    child = multiprocessing.get_context("fork").Process(target=_drop_and_collect, args=(holder,))
    child.start()
    child.join(JOIN_S)
    if child.exitcode is None:
        child.kill()
        child.join(JOIN_S)
    return child.exitcode


def _expected() -> list[torch.Tensor]:
    return list(torch.utils.data.DataLoader(Squares(), batch_size=4))


def test_a_child_dropping_its_copy_of_an_iterator_leaves_the_workers_running() -> None:
    loader = stoker.DataLoader(Squares(), batch_size=4, num_workers=2)
    holder: list[Any] = [iter(loader)]  # the only reference; the child empties its copy
    got = [next(holder[0]), next(holder[0])]
    assert _fork_a_child_that_drops(holder) == 0
    got += list(holder[0])
    expected = _expected()
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))

