"""Batches of torch's own classes gathered in the main process from the copy the workers
started with (NOTE [ Gathers read the workers' starting copy ]), with real workers: torch's
batches, workers started and stopped as torch's, a batch the copy declines loaded by its
worker (with torch's result or error), an idle worker's death reported, and no copy past the
limit. The change after ``iter()`` is test 11 of ``test_same_as_torch_by_default``."""

from __future__ import annotations

import functools
import mmap
import os
import signal

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import TensorDataset
from torch.utils.data._utils import collate as torch_collate

import stoker
from stoker.engine import main_gathers


def _data(n: int = 64) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, generator=gen), torch.arange(n))


def _batches(loader: object) -> list[list[torch.Tensor]]:
    return list(loader)  # type: ignore[call-overload]


def _equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(torch.equal(s, t) and s.dtype == t.dtype for s, t in zip(
            x, y, strict=True)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("persistent", [False, True])
def test_torchs_batches_gathered_here_while_the_workers_run(TorchLoader, persistent):
    ds = _data()
    kwargs = dict(batch_size=8, shuffle=True, num_workers=2, persistent_workers=persistent,
                  timeout=60)
    reference = TorchLoader(ds, generator=torch.Generator().manual_seed(3), **kwargs)
    expected = [_batches(reference) for _ in range(2)]
    loader = stoker.DataLoader(ds, generator=torch.Generator().manual_seed(3), **kwargs)
    it = iter(loader)
    workers = it._workers
    assert len(workers) == 2 and all(w.is_alive() for w in workers)  # started as torch's
    got = [list(it), _batches(loader)]
    assert _equal(got[0], expected[0]) and _equal(got[1], expected[1])
    assert all(t.is_shared() for epoch in got for b in epoch for t in b)  # as a worker's arrive
    assert loader.stats().gathered_in_main == 16


def test_a_batch_the_copy_declines_is_loaded_by_its_worker(TorchLoader):
    # -1 is a valid index for torch's TensorDataset (a row from the end) but not for the gather;
    # 64 is past the end: torch's worker raises, and so does the worker here
    ds = _data()
    batches = [[0, 1], [2, -1], [3, 4], [64, 5]]

    def run(cls: type) -> tuple[list, str, object]:
        loader = cls(ds, batch_sampler=batches, num_workers=2, timeout=60)
        out = []
        with pytest.raises(IndexError) as info:
            for b in loader:
                out.append(b)
        return out, str(info.value) + " ".join(getattr(info.value, "__notes__", [])), loader

    expected, torch_error, _ = run(TorchLoader)
    got, error, loader = run(stoker.DataLoader)
    assert _equal(got, expected) and len(got) == 3
    assert "index 64 is out of bounds for dimension 0 with size 64" in torch_error
    assert "index 64 is out of bounds for dimension 0 with size 64" in error
    # torch's header; stoker's note (the known difference worker_exceptions in the fuzzer)
    assert "worker process 1." in torch_error and "raised in DataLoader worker 1 " in error
    assert loader.stats().gathered_in_main == 2  # [0, 1] and [3, 4]


def test_an_idle_worker_that_dies_is_reported():
    ds = _data(4 * 200)
    it = iter(stoker.DataLoader(ds, batch_size=4, num_workers=2, timeout=60))
    next(it)
    victim = it._workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    assert victim.exitcode == -signal.SIGKILL
    taken = 0
    with pytest.raises(stoker.WorkerDiedError, match=r"is killed by signal: Killed\."):
        for _ in it:
            taken += 1
    assert taken <= main_gathers.DEATH_CHECK_EVERY


def test_no_copy_past_the_limit(TorchLoader, monkeypatch):
    monkeypatch.setattr(main_gathers, "_MAX_COPY_BYTES", 64 * 3 * 4)  # below x and y
    ds = _data()
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2, timeout=60)
    assert _equal(_batches(loader), _batches(TorchLoader(ds, batch_size=8, num_workers=2)))
    stats = loader.stats()
    assert stats.gathered_in_main == 0 and stats.batched == 8  # gathered in the workers


class _LoggedBatches:
    """A batch sampler that logs each batch it gives, so the log shows when the loader asks."""

    def __init__(self, n: int, size: int, log: list) -> None:
        self.n, self.size, self.log = n, size, log

    def __iter__(self):
        for start in range(0, self.n, self.size):
            self.log.append(("sampler", start))
            yield list(range(start, min(start + self.size, self.n)))

    def __len__(self) -> int:
        return -(-self.n // self.size)


@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("num_workers,prefetch_factor", [(1, 1), (2, 1), (3, 2)])
def test_the_sampler_is_asked_when_torchs_loader_asks_it(
        TorchLoader, in_order, num_workers, prefetch_factor):
    # Gathered tasks count against their worker's depth until handed out: no task more or
    # fewer in flight, so the same batches (in_order=False once lost one) at the same points.
    ds = _data(10)

    def run(cls: type) -> list:
        log: list = []
        loader = cls(ds, batch_sampler=_LoggedBatches(10, 2, log), num_workers=num_workers,
                     prefetch_factor=prefetch_factor, in_order=in_order, timeout=60)
        for epoch in range(2):
            for batch in loader:
                log.append(("got", epoch, batch[1].tolist()))
        return log

    got, expected = run(stoker.DataLoader), run(TorchLoader)
    if in_order:
        assert got == expected
    else:  # torch yields in the order its workers finish: the same asks, the same batches
        assert [e[0] for e in got] == [e[0] for e in expected]
        assert sorted(map(str, got)) == sorted(map(str, expected))


@pytest.mark.parametrize("num_workers", [1, 2])
def test_with_in_order_false_a_workers_batches_keep_its_order(TorchLoader, num_workers):
    # -1 declines (the worker loads it); the batch after it, for the same worker, must not
    # come first: torch yields one worker's batches in the order it loads them (soak seeds
    # 482 and 483 found the gathered one overtaking)
    ds = torch.utils.data.Subset(
        TensorDataset(torch.tensor([1000.25, 1001.25, 1002.25, 1003.25])), [-1, 0, 1, 2])

    def run(cls: type) -> list:
        loader = cls(ds, num_workers=num_workers, in_order=False, timeout=60)
        return [[b[0].tolist() for b in loader] for _ in range(2)]

    got, expected = run(stoker.DataLoader), run(TorchLoader)
    if num_workers == 1:
        assert got == expected
    else:  # across workers the order is torch's timing; each worker's own is fixed
        for epoch, reference in zip(got, expected, strict=True):
            assert sorted(map(str, epoch)) == sorted(map(str, reference))
            # worker 0 loads positions 0 (index -1: declined) and 2 (gathered), in that order
            assert [b for b in epoch if b in ([1003.25], [1001.25])] == [[1003.25], [1001.25]]


def _shared(x: torch.Tensor) -> torch.Tensor:
    return x.share_memory_()


def _in_a_shared_mapping(x: torch.Tensor) -> torch.Tensor:
    out = torch.frombuffer(mmap.mmap(-1, x.nbytes), dtype=x.dtype).view(x.shape)
    return out.copy_(x)


@pytest.mark.parametrize(("context", "place"), [
    ("fork", _shared), ("fork", _in_a_shared_mapping), ("spawn", lambda x: x)],
    ids=["fork-share_memory_", "fork-mmap", "spawn"])
def test_memory_the_workers_share_is_read_as_torchs_workers_read_it(
        TorchLoader, context, place):
    # NOTE [ Memory a fork copies ]: torch's persistent workers read the second epoch's rows
    # from memory they share with this process (spawn's pickling moves each tensor there), so
    # they see what was written between the epochs; no copy may stand in for it
    def run(cls: type) -> tuple[list, list, object]:
        ds = TensorDataset(place(torch.arange(32.0).reshape(16, 2)), torch.arange(16))
        loader = cls(ds, batch_size=4, num_workers=2, persistent_workers=True, timeout=60,
                     multiprocessing_context=context)
        first = _batches(loader)
        ds.tensors[0].mul_(-1)
        return first, _batches(loader), loader

    *expected, _ = run(TorchLoader)
    *got, loader = run(stoker.DataLoader)
    assert float(expected[1][0][0].sum()) < 0  # torch's workers saw the write
    assert _equal(got[0], expected[0]) and _equal(got[1], expected[1])
    assert loader.stats().gathered_in_main == 0


class _StacksPlus1000(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if func is torch.stack and out.is_floating_point():
            out.add_(1000)
        return out


def test_a_mode_active_as_the_workers_fork_stays_theirs(TorchLoader):
    # torch's workers fork inside the mode and keep it for every batch they stack; the main
    # process has left it by the time it asks for them
    def run(cls: type) -> tuple[list, object]:
        loader = cls(_data(), batch_size=4, num_workers=2, timeout=60)
        with _StacksPlus1000():
            it = iter(loader)
        return list(it), loader

    expected, _ = run(TorchLoader)
    got, loader = run(stoker.DataLoader)
    assert all(float(b[0].min()) > 500 for b in expected)  # every batch stacked in the mode
    assert _equal(got, expected) and loader.stats().gathered_in_main == 0


def test_the_collate_map_as_the_workers_fork_stays_theirs(TorchLoader):
    # a tensor function in torch's default_collate map at iter(), put back right after: the
    # forked workers stack every batch with it
    def plus_1000(batch: list, *, collate_fn_map: dict | None = None) -> torch.Tensor:
        return torch_collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map) + 1000

    def run(cls: type) -> tuple[list, object]:
        loader = cls(_data(), batch_size=4, num_workers=2, timeout=60)
        stock = torch_collate.default_collate_fn_map[torch.Tensor]
        torch_collate.default_collate_fn_map[torch.Tensor] = plus_1000
        try:
            it = iter(loader)
        finally:
            torch_collate.default_collate_fn_map[torch.Tensor] = stock
        return list(it), loader

    expected, _ = run(TorchLoader)
    got, loader = run(stoker.DataLoader)
    assert all(float(b[0].min()) > 500 for b in expected)
    assert _equal(got, expected) and loader.stats().gathered_in_main == 0


def test_a_class_patched_as_the_workers_fork_stays_patched_in_them(TorchLoader, monkeypatch):
    # TensorDataset.__getitem__ patched at iter(), put back right after: the forked workers
    # call the patched method for every sample
    stock = TensorDataset.__getitem__

    def plus_1000(self: TensorDataset, index: int) -> tuple:
        return tuple(t + 1000 if t.is_floating_point() else t for t in stock(self, index))

    def run(cls: type) -> tuple[list, object]:
        loader = cls(_data(), batch_size=4, num_workers=2, timeout=60)
        with monkeypatch.context() as patch:
            patch.setattr(TensorDataset, "__getitem__", plus_1000)
            it = iter(loader)
        return list(it), loader

    expected, _ = run(TorchLoader)
    got, loader = run(stoker.DataLoader)
    assert all(float(b[0].min()) > 500 for b in expected)
    assert _equal(got, expected) and loader.stats().gathered_in_main == 0


def _plus_1000_if_float(out: object) -> object:
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        return out + 1000
    return out


def _rebinding(name: str, features: torch.Tensor) -> tuple[object, str, object]:
    """(owner, attribute, replacement): a program's own version of one function torch's path
    for a TensorDataset batch calls, adding 1000 to the floats it gives."""
    if name == "torch.stack":
        stock = torch.stack

        def stack(*args: object, **kwargs: object) -> object:
            return _plus_1000_if_float(stock(*args, **kwargs))
        return torch, "stack", stack
    if name == "Tensor.__getitem__":
        stock_item = torch.Tensor.__getitem__

        def getitem(self: torch.Tensor, index: object) -> object:
            out = stock_item(self, index)
            return _plus_1000_if_float(out) if self is features else out
        return torch.Tensor, "__getitem__", getitem
    stock_collate = torch_collate.collate

    def collate(batch: list, *, collate_fn_map: dict | None = None) -> object:
        return _plus_1000_if_float(stock_collate(batch, collate_fn_map=collate_fn_map))
    return torch_collate, "collate", collate


@pytest.mark.parametrize("name", ["torch.stack", "Tensor.__getitem__", "collate"])
@pytest.mark.parametrize(("workers", "only_at_iter"), [(0, False), (2, False), (2, True)])
def test_a_function_torchs_path_calls_rebound_by_the_program_is_called(
        TorchLoader, monkeypatch, name, workers, only_at_iter):
    # torch.stack, Tensor.__getitem__ or default_collate's recursion replaced by the program:
    # torch's path calls the replacement for every batch (its forked workers keep what was
    # there at iter()), so the gathers must not go around it
    ds = _data()
    owner, attribute, replacement = _rebinding(name, ds.tensors[0])

    def run(cls: type) -> tuple[list, object]:
        loader = cls(ds, batch_size=4, num_workers=workers,
                     timeout=60 if workers else 0)
        with monkeypatch.context() as patch:
            patch.setattr(owner, attribute, replacement)
            it = iter(loader)
            if not only_at_iter:
                return list(it), loader
        return list(it), loader

    expected, _ = run(TorchLoader)
    got, loader = run(stoker.DataLoader)
    assert all(float(b[0].min()) > 500 for b in expected)
    assert _equal(got, expected)
    assert loader.stats().gathered_in_main == 0


# What only the gathers call (torch's path calls torch.stack and Tensor.__getitem__ instead),
# and the sampler fast path's view of randperm; torch's path calls some of these itself (the
# base seed's torch.empty, the rebuild's set_), so the counts are compared, not asserted zero.
_ONLY_STOKERS = [(torch, name) for name in ("index_select", "empty", "empty_like", "frombuffer",
                                            "aminmax")] + [
    (torch.Tensor, name) for name in ("index_copy_", "view", "copy_", "set_", "numpy")]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_function_only_the_gathers_call_rebound_by_the_program_is_not_called(
        TorchLoader, monkeypatch, workers):
    # a program's counting wrappers (functools.wraps) over functions torch's path for these
    # classes does not call: the gathers call torch's C functions themselves, so the program
    # counts what it counts under torch (NOTE [ torch's own functions ])
    counts: dict[str, int] = {}

    def counting(name: str, stock: object) -> object:
        @functools.wraps(stock)  # type: ignore[arg-type]
        def wrapper(*args: object, **kwargs: object) -> object:
            counts[name] = counts.get(name, 0) + 1
            return stock(*args, **kwargs)  # type: ignore[operator]
        return wrapper

    ds = torch.utils.data.ConcatDataset([_data(40), _data(24)])  # index_copy_ joins the parts

    def run(cls: type) -> tuple[list, dict[str, int], object]:
        counts.clear()
        torch.manual_seed(0)  # the shuffle draws from the global RNG
        loader = cls(ds, batch_size=8, shuffle=True, num_workers=workers,
                     persistent_workers=bool(workers), timeout=60 if workers else 0)
        with monkeypatch.context() as patch:
            for owner, name in _ONLY_STOKERS:
                patch.setattr(owner, name, counting(name, getattr(owner, name)))
            batches = [list(loader) for _ in range(2)]
        return batches, dict(counts), loader

    expected, torchs, _ = run(TorchLoader)
    got, stokers, loader = run(stoker.DataLoader)
    assert all(_equal(g, e) for g, e in zip(got, expected, strict=True))
    assert stokers == torchs
    if workers:  # the gathers ran
        assert loader.stats().gathered_in_main > 0
