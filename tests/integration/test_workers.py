"""Worker processes: get_worker_info, sharding, worker_init_fn, seeding, persistent workers,
timeout, in_order=False, prefetch_factor, multiprocessing_context, pin_memory, early exit.

Timing is never proven with sleeps: blocking datasets wait on ``multiprocessing`` events that
the test sets, and every wait has a timeout. Where torch defines the behaviour, the test runs
torch's DataLoader in the same test and compares.
"""

from __future__ import annotations

import collections
import functools
import gc
import multiprocessing
import os
import threading
import time
import warnings
import weakref
from typing import Any

import psutil
import pytest
import torch
from _datasets import (
    ContextProbeDS,
    GatedDS,
    MapDS,
    WorkerProbeDS,
    WorkerProbeIterDS,
    assert_batches_equal,
    drop_tracebacks,
    failing_worker_init,
    read_records,
    record_worker_init,
    record_worker_rng,
)
from torch.utils.data import get_worker_info

SEED = 2024
EVENT_TIMEOUT_S = 30.0


def base_seeds(seed: int, count: int) -> list[int]:
    """The base seeds torch draws from ``Generator().manual_seed(seed)``, one per iterator."""
    g = torch.Generator().manual_seed(seed)
    return [
        int(torch.empty((), dtype=torch.int64).random_(generator=g).item()) for _ in range(count)
    ]


def gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------
# get_worker_info and sharding
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset_cls", [WorkerProbeDS, WorkerProbeIterDS], ids=["map", "iter"])
def test_get_worker_info_inside_workers(Loader, dataset_cls):
    assert get_worker_info() is None
    loader = Loader(dataset_cls(12), batch_size=None, num_workers=2, generator=gen())
    samples = []
    for sample in loader:
        assert get_worker_info() is None, "get_worker_info() must be None in the main process"
        samples.append(sample)
    assert get_worker_info() is None
    (base,) = base_seeds(SEED, 1)
    assert sorted(s[0] for s in samples) == list(range(12))
    pids_by_worker: dict[int, set[int]] = collections.defaultdict(set)
    for _index, pid, worker_id, num_workers, seed, dataset_is_self in samples:
        assert pid != os.getpid()
        assert worker_id in (0, 1)
        assert num_workers == 2
        assert seed == base + worker_id
        assert dataset_is_self, "WorkerInfo.dataset must be the worker's own dataset object"
        pids_by_worker[worker_id].add(pid)
    assert set(pids_by_worker) == {0, 1}
    assert all(len(p) == 1 for p in pids_by_worker.values())
    assert pids_by_worker[0] != pids_by_worker[1]


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_each_batch_is_loaded_by_torchs_worker(Loader, TorchLoader, num_workers, persistent):
    # torch sends task k to worker k mod num_workers; a dataset may rely on it (torch's own
    # test_ind_worker_queue does), whatever the default seeding.
    def worker_ids(loader_cls: type) -> list[list[int]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 3 workers on a 2-core machine
            loader = loader_cls(WorkerProbeDS(40), batch_size=3, num_workers=num_workers,
                                persistent_workers=persistent, timeout=60)
            return [[batch[2].tolist() for batch in loader] for _ in range(2)]

    expected = worker_ids(TorchLoader)
    assert expected[0][:num_workers] == [[w] * 3 for w in range(num_workers)]
    assert worker_ids(Loader) == expected


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_iterator_lists_its_worker_processes_like_torch(Loader, persistent):
    # torch's `_workers`: code reads the pids, or joins the workers after the loop (torch's own
    # tests do), also once the epoch has stopped them.
    loader = Loader(WorkerProbeDS(8), batch_size=2, num_workers=2,
                    persistent_workers=persistent, timeout=60)
    it = iter(loader)
    batches = list(it)
    pids = {int(pid) for batch in batches for pid in batch[1]}
    workers = it._workers
    assert {w.pid for w in workers} == pids and len(workers) == 2
    if persistent:
        assert all(w.is_alive() for w in workers)
        it._shutdown_workers()
    for w in workers:
        w.join(60)
        assert not w.is_alive() and w.exitcode == 0


@pytest.mark.parametrize("dataset_cls", [WorkerProbeDS, WorkerProbeIterDS], ids=["map", "iter"])
def test_get_worker_info_is_none_without_workers(Loader, dataset_cls):
    samples = list(Loader(dataset_cls(5), batch_size=None, num_workers=0))
    assert [s[0] for s in samples] == list(range(5))
    # batch_size=None: default_convert turns the sample tuples into lists, like torch.
    assert all(s[1:] == [os.getpid(), -1, 0, -1, False] for s in samples)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_sharded_iterable_yields_each_element_once(Loader, batch_size):
    loader = Loader(WorkerProbeIterDS(41), batch_size=batch_size, num_workers=2)
    indices: list[int] = []
    for batch in loader:
        first = batch[0]
        indices.extend([first] if batch_size is None else first.tolist())
    assert sorted(indices) == list(range(41))


# --------------------------------------------------------------------------------------------
# worker_init_fn
# --------------------------------------------------------------------------------------------


def test_worker_init_fn_runs_once_per_worker_per_epoch(Loader, tmp_path):
    path = str(tmp_path / "init.jsonl")
    loader = Loader(
        MapDS(10, "tensor"),
        batch_size=2,
        num_workers=2,
        worker_init_fn=functools.partial(record_worker_init, path),
    )
    for epoch in range(3):
        assert len(list(loader)) == 5
        records = read_records(path)
        assert len(records) == 2 * (epoch + 1), records
        ids = collections.Counter(r["worker_id"] for r in records)
        assert ids == {0: epoch + 1, 1: epoch + 1}


def test_worker_init_fn_runs_once_per_worker_with_persistent_workers(Loader, tmp_path):
    path = str(tmp_path / "init.jsonl")
    loader = Loader(
        WorkerProbeDS(10),
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=functools.partial(record_worker_init, path),
    )
    sample_pids = set()
    for _ in range(3):
        sample_pids |= {s[1] for s in loader}
    records = read_records(path)
    assert sorted(r["worker_id"] for r in records) == [0, 1]
    assert {r["pid"] for r in records} == sample_pids


def test_exception_in_worker_init_fn_surfaces(Loader):
    loader = Loader(
        MapDS(10, "tensor"), batch_size=2, num_workers=2, worker_init_fn=failing_worker_init
    )
    with pytest.raises(ValueError, match="bad init in worker_init_fn") as info:
        list(loader)
    drop_tracebacks(info.value)
    del info


# --------------------------------------------------------------------------------------------
# Seeding
# --------------------------------------------------------------------------------------------


def _rng_records(loader_cls: type, path: str, epochs: int, persistent: bool) -> list[list[dict]]:
    """Per epoch, the worker_init_fn draws of every worker, sorted by worker id."""
    loader = loader_cls(
        MapDS(8, "tensor"),
        batch_size=2,
        num_workers=2,
        generator=gen(),
        persistent_workers=persistent,
        worker_init_fn=functools.partial(record_worker_rng, path),
    )
    per_epoch, seen = [], 0
    for _ in range(epochs):
        list(loader)
        records = read_records(path)
        per_epoch.append(sorted(records[seen:], key=lambda r: r["worker_id"]))
        seen = len(records)
    return per_epoch


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_seeds_and_rng_draws_match_torch(Loader, TorchLoader, tmp_path, persistent):
    """random, numpy and torch global RNGs in a worker (as worker_init_fn sees them) and
    WorkerInfo.seed equal torch's for the same generator seed, epoch after epoch."""
    expected = _rng_records(TorchLoader, str(tmp_path / "torch.jsonl"), 2, persistent)
    actual = _rng_records(Loader, str(tmp_path / "actual.jsonl"), 2, persistent)
    assert actual == expected
    bases = base_seeds(SEED, 2)
    if persistent:
        assert actual[1] == [], "persistent workers: worker_init_fn runs once, not per epoch"
    for epoch, records in enumerate(actual[:1] if persistent else actual):
        base = bases[epoch]
        assert [r["worker_id"] for r in records] == [0, 1]
        assert [r["seed"] for r in records] == [base, base + 1]
        assert records[0]["random"] != records[1]["random"]
        assert records[0]["numpy"] != records[1]["numpy"]
        assert records[0]["torch"] != records[1]["torch"]
    if not persistent:
        assert actual[0] != actual[1], "a new epoch draws a new base seed without persistence"


def test_persistent_workers_keep_pids_and_seeds(Loader, TorchLoader):
    def epochs(loader_cls: type) -> list[dict[int, tuple[int, int]]]:
        loader = loader_cls(
            WorkerProbeDS(10),
            batch_size=None,
            num_workers=2,
            persistent_workers=True,
            generator=gen(),
        )
        out = []
        for _ in range(3):
            out.append({s[2]: (s[1], s[4]) for s in loader})  # worker id -> (pid, seed)
        return out

    actual = epochs(Loader)
    assert set(actual[0]) == {0, 1}
    assert actual[0] == actual[1] == actual[2], "persistent workers: same pids and seeds"
    expected_seeds = [{w: seed for w, (_pid, seed) in e.items()} for e in epochs(TorchLoader)]
    assert [{w: seed for w, (_pid, seed) in e.items()} for e in actual] == expected_seeds


# --------------------------------------------------------------------------------------------
# timeout and in_order
# --------------------------------------------------------------------------------------------


def test_timeout_raises_torchs_runtime_error(Loader):
    release, started = multiprocessing.Event(), multiprocessing.Event()
    loader = Loader(
        GatedDS(4, release, started, block_index=None), batch_size=1, num_workers=2, timeout=1
    )
    it = iter(loader)
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as info:
            next(it)
        elapsed = time.monotonic() - t0
        assert str(info.value) == "DataLoader timed out after 1 seconds"
        assert elapsed >= 0.9, f"timed out after {elapsed:.2f} s, before the 1 s timeout"
        assert started.wait(EVENT_TIMEOUT_S), "no worker ever fetched"
        drop_tracebacks(info.value)
        del info
    finally:
        release.set()
        del it, loader


def test_a_timed_out_iterator_goes_with_its_traceback(Loader):
    # a script that retries on the timeout: torch's iterator (and its workers) goes as soon as
    # the caught error does, by reference counting; stoker's stayed in a cycle through the
    # frame that raised the error until the collector ran (found by a blind sweep)
    release, started = multiprocessing.Event(), multiprocessing.Event()
    loader = Loader(
        GatedDS(4, release, started, block_index=None), batch_size=1, num_workers=1, timeout=1
    )

    def attempt() -> Any:
        it = iter(loader)
        ref = weakref.ref(it)
        try:
            next(it)
        except RuntimeError as exc:
            assert str(exc) == "DataLoader timed out after 1 seconds"
        finally:
            del it
        return ref

    # ``release`` is never set: the worker is stopped while it waits (after which set() could
    # block on the waiter it lost); a kept iterator's worker gives up after BLOCK_TIMEOUT_S
    gc.disable()
    try:
        ref = attempt()
        assert ref() is None, "the timed-out iterator is kept by a reference cycle"
    finally:
        gc.enable()


def test_in_order_false_returns_ready_batches_first(Loader):
    release, started = multiprocessing.Event(), multiprocessing.Event()
    loader = Loader(
        GatedDS(8, release, started, block_index=0), batch_size=1, num_workers=2, in_order=False
    )
    it = iter(loader)
    try:
        first = next(it)
        assert started.wait(EVENT_TIMEOUT_S), "index 0 was never fetched"
        assert not release.is_set()
        assert first.tolist() != [0], "in_order=False waited for the blocked batch 0"
    finally:
        release.set()
    rest = list(it)
    del it
    unordered = sorted(b.tolist() for b in [first, *rest])
    released = multiprocessing.Event()
    released.set()
    ordered = list(
        Loader(GatedDS(8, released, multiprocessing.Event()), batch_size=1, num_workers=2)
    )
    assert [b.tolist() for b in ordered] == [[i] for i in range(8)]
    assert unordered == sorted(b.tolist() for b in ordered)


def test_in_order_false_same_multiset_as_in_order(Loader, TorchLoader):
    def batches(loader_cls: type, in_order: bool) -> list[Any]:
        loader = loader_cls(
            MapDS(23, "tensor"),
            batch_size=3,
            shuffle=True,
            num_workers=2,
            in_order=in_order,
            generator=gen(),
        )
        return sorted(b.tolist() for b in loader)

    expected = batches(TorchLoader, True)
    assert batches(Loader, False) == expected
    assert batches(Loader, True) == expected


# --------------------------------------------------------------------------------------------
# prefetch_factor
# --------------------------------------------------------------------------------------------


def _outcome(loader_cls: type, **kw: Any) -> tuple[str, Any]:
    """('ctor' | 'iter', exception type and message) or ('ok', prefetch_factor)."""
    try:
        loader = loader_cls(MapDS(6, "tensor"), batch_size=2, **kw)
    except Exception as exc:
        return ("ctor", type(exc), str(exc))
    try:
        assert len(list(loader)) == 3
    except Exception as exc:
        drop_tracebacks(exc)
        return ("iter", type(exc), str(exc))
    return ("ok", loader.prefetch_factor)


# torch's iterator __del__ fails on the half-built iterator prefetch_factor=0 leaves behind.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    "kw",
    [
        dict(num_workers=0, prefetch_factor=2),
        dict(num_workers=0, prefetch_factor=0),
        dict(num_workers=2, prefetch_factor=-1),
        dict(num_workers=2, prefetch_factor=0),
        dict(num_workers=2, prefetch_factor=1),
        dict(num_workers=2, prefetch_factor=None),
        dict(num_workers=0, prefetch_factor=None),
    ],
    ids=lambda kw: f"nw{kw['num_workers']}-pf{kw['prefetch_factor']}",
)
def test_prefetch_factor_validation_like_torch(Loader, TorchLoader, kw):
    expected = _outcome(TorchLoader, **kw)
    actual = _outcome(Loader, **kw)
    assert actual[:2] == expected[:2]
    if expected[0] == "ctor":
        assert actual[2] == expected[2], "the error message differs from torch's"


# --------------------------------------------------------------------------------------------
# multiprocessing_context
# --------------------------------------------------------------------------------------------

CONTEXTS = {
    "fork-str": ("fork", lambda: "fork"),
    "fork-context": ("fork", lambda: multiprocessing.get_context("fork")),
    "fork-torch_context": ("fork", lambda: torch.multiprocessing.get_context("fork")),
    "spawn-str": ("spawn", lambda: "spawn"),
    "spawn-context": ("spawn", lambda: multiprocessing.get_context("spawn")),
    "forkserver-str": ("forkserver", lambda: "forkserver"),
    "forkserver-context": ("forkserver", lambda: multiprocessing.get_context("forkserver")),
}


IDLE_WORKER_CHECK_S = 1.5


@pytest.mark.parametrize("context_kind", list(CONTEXTS))
def test_multiprocessing_context(Loader, context_kind):
    """Workers start the asked way. With persistent workers (the "-str" cases) they also stay
    up while the main process is busy elsewhere between epochs (a worker that wrongly decides
    its parent is gone, e.g. by comparing getppid() with the main pid under forkserver, exits)."""
    method, make_context = CONTEXTS[context_kind]
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this platform")
    persistent = context_kind.endswith("-str")
    loader = Loader(
        ContextProbeDS(),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=make_context(),
        persistent_workers=persistent,
    )
    assert loader.multiprocessing_context.get_start_method() == method
    samples = list(loader)
    assert [s[0] for s in samples] == [0, 1, 2, 3]
    own_cmdline = " ".join(psutil_cmdline())
    for _i, _pid, ppid, cmdline in samples:
        if method == "fork":
            assert ppid == os.getpid() and cmdline == own_cmdline, (ppid, cmdline)
        elif method == "spawn":
            assert ppid == os.getpid() and "spawn_main" in cmdline, (ppid, cmdline)
        else:
            assert ppid != os.getpid() and "forkserver" in cmdline, (ppid, cmdline)
    if persistent:
        workers = [psutil.Process(pid) for pid in {s[1] for s in samples}]
        gone, _alive = psutil.wait_procs(workers, timeout=IDLE_WORKER_CHECK_S)
        assert not gone, f"idle persistent workers exited: {[(p.pid, p.returncode) for p in gone]}"
        again = list(loader)
        assert [s[:2] for s in again] == [s[:2] for s in samples], "same workers, same order"


def psutil_cmdline() -> list[str]:
    with open("/proc/self/cmdline", "rb") as fh:
        return fh.read().decode(errors="replace").split("\0")[:-1]


# --------------------------------------------------------------------------------------------
# pin_memory without an accelerator
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_without_accelerator_warns_like_torch(Loader, TorchLoader, num_workers):
    def run(loader_cls: type) -> tuple[list, list]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = loader_cls(
                MapDS(9, "dict"), batch_size=4, pin_memory=True, num_workers=num_workers
            )
            batches = list(loader)
        return batches, [(w.category, str(w.message)) for w in caught]

    expected_batches, expected_warnings = run(TorchLoader)
    batches, caught = run(Loader)
    assert expected_warnings, "torch warns here"
    assert caught == expected_warnings
    assert_batches_equal(expected_batches, batches)


# --------------------------------------------------------------------------------------------
# Leaving early: the leak check (conftest.py) proves nothing is left behind
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_break_mid_epoch_then_delete(Loader, persistent):
    loader = Loader(MapDS(40, "tensor"), batch_size=2, num_workers=2, persistent_workers=persistent)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    # The next epoch starts from the beginning.
    assert len(list(loader)) == 20
    for k, _ in enumerate(loader):
        if k == 1:
            break
    del loader


def test_abandoned_iterator_then_delete(Loader):
    loader = Loader(MapDS(40, "tensor"), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    del it
    del loader


def test_main_process_sees_no_worker_info_with_iterable_and_workers(Loader):
    # The dataset object in the main process is never touched by worker-side iteration.
    ds = WorkerProbeIterDS(6)
    assert len(list(Loader(ds, batch_size=None, num_workers=2))) == 6
    assert [s[2] for s in ds] == [-1] * 6


# --------------------------------------------------------------------------------------------
# The leak check itself (conftest.py) sees each kind of leftover
# --------------------------------------------------------------------------------------------


def test_leak_check_sees_each_kind_of_leftover(leak_tools):
    before = leak_tools.snapshot()
    stop_thread, stop_process = threading.Event(), multiprocessing.Event()
    thread = threading.Thread(target=stop_thread.wait, args=(EVENT_TIMEOUT_S,), name="probe-th")
    thread.start()
    proc = multiprocessing.get_context("fork").Process(
        target=stop_process.wait, args=(EVENT_TIMEOUT_S,)
    )
    proc.start()
    read_fd, write_fd = os.pipe()
    memfd = os.memfd_create("leak-probe")
    shm_path = f"/dev/shm/leak-probe-{os.getpid()}"
    open(shm_path, "w").close()
    try:
        left = "\n".join(leak_tools.leftovers(before, final=True))
        assert "'probe-th'" in left
        assert f"child process pid {proc.pid} " in left
        assert "-> /memfd:leak-probe" in left
        assert f"fd {read_fd} -> pipe:[" in left
        assert f"/dev/shm entry leak-probe-{os.getpid()}" in left
    finally:
        stop_thread.set()
        stop_process.set()
        thread.join(EVENT_TIMEOUT_S)
        proc.join(EVENT_TIMEOUT_S)
        proc.close()
        for fd in (read_fd, write_fd, memfd):
            os.close(fd)
        os.unlink(shm_path)
    assert leak_tools.wait_for_baseline(before) == []


class _WorkerIds(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.utils.data.get_worker_info().id


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_each_worker_gets_its_first_task_before_the_next_is_forked(monkeypatch):
    # NOTE [ Tasks before the next fork ]: the first worker works while the others are forked,
    # and which worker loads which batch stays torch's at the start (task k -> worker k mod n).
    import stoker
    from stoker.engine import process_iter, worker_start

    loads_at_start = []
    real_start = worker_start.start_worker

    def start_worker(ctx, spec, *args):
        if spec.worker_id > 0:
            loads_at_start.append(list(started[0]._book.load))
        return real_start(ctx, spec, *args)

    started = []
    real_init = process_iter.ProcessIterator._init_dispatch

    def init_dispatch(self):
        real_init(self)
        started.append(self)

    monkeypatch.setattr(worker_start, "start_worker", start_worker)
    monkeypatch.setattr(process_iter.ProcessIterator, "_init_dispatch", init_dispatch)
    loader = stoker.DataLoader(_WorkerIds(), batch_size=2, num_workers=3, timeout=60,
                               worker_type="process")
    ids = [batch.tolist() for batch in loader]
    assert loads_at_start == [[1, 0, 0], [1, 1, 0]]
    assert ids[:6] == [[0, 0], [1, 1], [2, 2], [0, 0], [1, 1], [2, 2]]
