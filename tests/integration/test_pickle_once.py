"""NOTE [ Pickle once ] (``beyond_torch={"pickle_once"}``): spawn/forkserver workers get the
spec from one pickle; large arrays are shared copy-on-write, fds (shared tensors, shared lists)
reach every worker, a worker's writes stay its own, and a spec that does not pickle fails the
start with the pickle error. By default the workers are started as torch starts them, each
pickling its own arguments: what the dataset's pickling hooks and its arrays show is torch's
(found by a blind sweep of ordinary programs: ``__getstate__`` ran once, not once per worker)."""

from __future__ import annotations

import functools
import pickle
import traceback

import psutil
import pytest
import torch
from _datasets import (
    BadStateDS,
    BigArrayDS,
    FlagsDS,
    PicklingCounted,
    UnpicklableDS,
    touch_and_mark_array,
)

import stoker
from stoker.profile.memory_watch import MIB, read_uss

TIMEOUT_S = 120.0
METHODS = ["spawn", "forkserver"]


ONCE = {"pickle_once"}


def _epoch(dataset, method: str, loader_cls: type | None = None, **kwargs):
    loader = (loader_cls or stoker.DataLoader)(
        dataset,
        batch_size=8,
        num_workers=2,
        multiprocessing_context=method,
        timeout=TIMEOUT_S,
        **kwargs,
    )
    rows = []
    for batch in loader:
        rows += list(zip(*[t.tolist() for t in batch], strict=True))
    return rows


@pytest.mark.parametrize("method", METHODS)
def test_every_worker_reads_arrays_tensors_and_shared_lists_correctly(method: str) -> None:
    ds = BigArrayDS(mib=8)
    rows = _epoch(ds, method, beyond_torch=ONCE)
    assert len(rows) == 64 and len({r[0] for r in rows}) == 2  # both workers answered
    for i, (_pid, first, row_sum, viewed, t, name_len) in enumerate(rows):
        assert first == 0.0 and viewed == 1  # the array is a view of the shared mapping
        assert row_sum == float(ds.array[i * 37 % len(ds.array)].sum())
        assert t == i and name_len == len(f"name_{i}")


@pytest.mark.parametrize("method", METHODS)
def test_a_workers_writes_stay_its_own(method: str) -> None:
    ds = BigArrayDS(mib=1)
    rows = _epoch(ds, method, worker_init_fn=touch_and_mark_array, beyond_torch=ONCE)
    seen = {}  # pid -> the value it reads at array[0, 0]
    for pid, first, *_ in rows:
        seen.setdefault(pid, set()).add(first)
    assert sorted(v for values in seen.values() for v in values) == [1000.0, 1001.0]
    assert all(len(values) == 1 for values in seen.values())
    assert ds.array[0, 0] == 0.0  # nor does the main process see them


@pytest.mark.parametrize("method", METHODS)
def test_arrays_keep_their_writeable_flag(method: str) -> None:
    rows = _epoch(FlagsDS(), method, beyond_torch=ONCE)
    assert rows == [(1, 0)] * 4  # as under fork: the main process's flags


def _workers_uss(mib: int) -> list[int]:
    """Each worker's private memory once both read the whole array (worker_init_fn): a
    page that only one process maps counts as private, so both must be done."""
    loader = stoker.DataLoader(
        BigArrayDS(mib=mib),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=True,
        worker_init_fn=touch_and_mark_array,
        timeout=TIMEOUT_S,
        beyond_torch=ONCE,
    )
    it = iter(loader)
    pids = set()
    for batch in it:  # a whole epoch: both workers are past worker_init_fn
        pids.update(batch[0].tolist())
    assert len(pids) == 2
    uss = [read_uss(w.pid) for w in it._group.workers]
    del it, loader
    assert all(u is not None for u in uss)
    return uss  # type: ignore[return-value]


def test_workers_share_one_copy_of_a_large_array() -> None:
    """Pickled per worker, each worker would hold a private copy of the 64 MiB array it
    reads; shared, its pages are in neither worker's private memory (USS)."""
    small, big = _workers_uss(1), _workers_uss(64)
    extra = [b - s for b, s in zip(big, small, strict=True)]
    assert all(e < 16 * MIB for e in extra), (
        f"a 64 MiB array read by both workers adds {[round(e / MIB) for e in extra]} MiB "
        "to their private memory"
    )


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")  # torch's own hint
@pytest.mark.parametrize("beyond", [None, ONCE])
def test_a_spec_that_does_not_pickle_fails_the_start_with_the_pickle_error(beyond) -> None:
    loader = stoker.DataLoader(
        UnpicklableDS(), batch_size=4, num_workers=2, multiprocessing_context="spawn",
        beyond_torch=beyond,
    )
    before = len(psutil.Process().children())
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        iter(loader)
    assert len(psutil.Process().children()) == before
    torch_loader = torch.utils.data.DataLoader(
        UnpicklableDS(), batch_size=4, num_workers=2, multiprocessing_context="spawn"
    )
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        iter(torch_loader)  # torch raises the same kind of error from Process.start


def test_a_spec_that_does_not_unpickle_in_the_worker_is_named_in_the_death() -> None:
    """As torch's, each worker unpickles its arguments before any loader code runs in it: the
    worker dies, its traceback on stderr; the error names that cause beside sys.exit()."""
    loader = stoker.DataLoader(
        BadStateDS(), batch_size=4, num_workers=2, multiprocessing_context="spawn",
        timeout=TIMEOUT_S,
    )
    with pytest.raises(RuntimeError, match="exited unexpectedly") as info:
        next(iter(loader))
    assert "cannot unpickle the dataset, collate_fn or worker_init_fn" in str(info.value)


def test_a_spec_that_does_not_unpickle_in_the_worker_raises_its_error() -> None:
    """torch reports "worker exited unexpectedly"; pickled once, the worker's own error
    comes back."""
    loader = stoker.DataLoader(
        BadStateDS(), batch_size=4, num_workers=2, multiprocessing_context="spawn",
        timeout=TIMEOUT_S, beyond_torch=ONCE,
    )
    with pytest.raises(RuntimeError, match="cannot be restored in a worker") as info:
        next(iter(loader))
    text = "".join(traceback.format_exception(info.value))
    assert "while unpickling the dataset and the loader's functions" in text


@pytest.mark.parametrize("method", METHODS)
def test_by_default_each_worker_pickles_its_own_arguments_as_torchs(method: str) -> None:
    # the dataset's __getstate__ once per worker, in the thread that iterates, and each
    # worker's arrays its own (owndata), as under torch's loader
    def run(loader_cls: type) -> tuple:
        PicklingCounted.pickled.clear()
        rows = _epoch(PicklingCounted(), method, loader_cls)
        return sorted(rows), list(PicklingCounted.pickled)

    torchs = run(torch.utils.data.DataLoader)
    assert torchs[1] == ["MainThread", "MainThread"]
    assert run(stoker.DataLoader) == torchs
    assert run(functools.partial(stoker.DataLoader, beyond_torch=ONCE))[1] == ["MainThread"]
