"""MemoryWatch: the steady-growth decision on synthetic USS series, sampling cadence, the
advice's text and channel (a WARNING record on its logger and the loader's stats, never a
``warnings`` warning: issue 44), and find_largest_python_container. No processes, no sleeps:
a fake clock and a fake USS reader."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

from stoker.profile.memory_suspect import find_largest_python_container
from stoker.profile.memory_watch import (
    MIB,
    CopyOnReadWarning,
    GrowthRule,
    MemoryWatch,
    classify_growth,
    read_uss,
    steady_growth,
)
from stoker.sharing import SharedStrList


def mib(*values: float) -> list[int]:
    return [int(v * MIB) for v in values]


# -- the decision ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        (mib(12, 30, 50, 70, 90, 110, 130, 155), True),  # copy-on-read ramp (Appendix A.2)
        (mib(12, 40, 70, 100, 130), True),  # exactly min_samples
        (mib(12, 50, 90, 130), False),  # too few samples
        (mib(12, 12, 212, 212, 212, 212), False),  # one-off jump
        (mib(12, 13, 212, 213, 214, 215), False),  # one-off jump, then a trickle
        (mib(12, 100, 99.5, 150, 149.2, 200), True),  # dips under 1 MiB count as flat
        (mib(100, 200, 100, 200, 100, 200), False),  # sawtooth: a working set, not growth
        (mib(12, 20, 30, 40, 50, 60, 70), False),  # +58 MiB: under the 64 MiB floor
        (mib(12, 40, 70, 100, 130, 130, 130, 130, 130), True),  # ramp, then plateau
        (mib(12, 40, 70, 100, 130, 60, 20), False),  # grew, then freed it again
        (mib(1000, 1040, 1080, 1120, 1160), False),  # +160 MiB is under 20 % of 1000 MiB
        (mib(1000, 1060, 1120, 1180, 1240, 1300), True),  # +300 MiB, spread
    ],
)
def test_steady_growth(series: list[int], expected: bool) -> None:
    assert steady_growth(series) is expected


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        (mib(12, 30, 50, 70, 90, 110, 130, 155), "steady"),
        (mib(14, 187, 196, 196, 196), "jump"),  # shuffled reads of the 2,000,000-path list
        (mib(12, 12, 212, 212, 212, 212), "jump"),
        (mib(12, 12, 12, 212, 212, 212), "jump"),  # two samples after the jump: it held
        (mib(12, 12, 12, 12, 212, 212), None),  # not held long enough yet
        (mib(12, 12, 12, 212, 12), None),  # a spike
        (mib(12, 13, 14, 15, 16, 17), None),  # too small
        (mib(12, 100, 200, 300), None),  # too few samples
    ],
)
def test_classify_growth(series: list[int], expected: str | None) -> None:
    assert classify_growth(series) == expected


def test_growth_rule_thresholds() -> None:
    rule = GrowthRule(min_samples=3, min_growth_bytes=10 * MIB)
    assert steady_growth(mib(10, 16, 22, 28), rule)  # 18 MiB, 12 without the largest step
    assert not steady_growth(mib(10, 16, 22), rule)  # 6 MiB without the largest step
    assert not steady_growth(mib(10, 16, 22, 28), GrowthRule())
    assert GrowthRule().threshold(1000 * MIB) == 200 * MIB
    assert GrowthRule().threshold(10 * MIB) == 64 * MIB


# -- datasets for the warning and the finder -------------------------------------------------


class PathsDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.paths = [f"/data/train/class_{i % 1000}/img_{i:08d}.jpg" for i in range(n)]
        self.labels = [i % 1000 for i in range(n)]
        self.root = "/data"

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> str:
        return self.paths[index]


class Shared(Dataset):
    def __init__(self, n: int) -> None:
        self.paths = SharedStrList(f"/data/{i}.jpg" for i in range(n))
        self.classes = ["cat", "dog"]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> str:
        return self.paths[index]


class Records(Dataset):
    def __init__(self, n: int) -> None:
        self.index = {f"key{i:06d}": (i, f"/data/{i}.jpg") for i in range(n)}

    def __getitem__(self, index: int) -> Any:
        return index


class Slotted:
    __slots__ = ("blobs", "me")

    def __init__(self, n: int) -> None:
        self.blobs = [bytes(100) for _ in range(n)]
        self.me = self  # a cycle: the walk must not loop


LOGGER = "stoker.profile.memory_watch"


@contextlib.contextmanager
def told(caplog: pytest.LogCaptureFixture, expect: bool = True) -> Iterator[list[str]]:
    """The texts the watch says in the block, filled when it ends: its DEBUG records (NOTE
    [ Advice is quiet ]), each with ``CopyOnReadWarning`` as its ``category``. Nothing goes
    through ``warnings`` (under "error" a warning would raise); ``expect``: something is said
    (as ``pytest.warns``), else nothing."""
    texts: list[str] = []
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=LOGGER), warnings.catch_warnings():
        warnings.simplefilter("error")
        yield texts
    for r in caplog.records:
        if r.name == LOGGER:
            assert (r.levelno, getattr(r, "category", None)) == (logging.DEBUG,
                                                                 CopyOnReadWarning)
            texts.append(r.getMessage())
    assert bool(texts) == expect, texts


def _growth(watch: MemoryWatch, clock: list[float], pid: int, values: list[int], workers: int):
    results = []
    for k, v in enumerate(values):
        clock[0] = 10.0 + 2.5 * k
        results.append(watch.record(pid, v, num_workers=workers))
    return results


RAMP = mib(12, 30, 50, 70, 90, 110, 130, 155)


def test_advice_names_the_attribute_and_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    stats: list[str] = []
    watch = MemoryWatch(PathsDataset(200_000), clock=lambda: clock[0], read_uss=lambda p: None,
                        tell=stats.append)
    with told(caplog) as record:
        results = _growth(watch, clock, 4242, RAMP, workers=2)
    assert results == [False] * 5 + [True, False, False]  # +98 MiB, +78 without one step
    assert len(record) == 1
    assert stats == record  # the loader's stats get the same text
    est = find_largest_python_container(watch._dataset)
    assert est is not None
    size = f"{est[2] / MIB:.1f}"
    assert record[0] == (
        "stoker: DataLoader worker memory keeps growing: the private memory (USS) of worker "
        "pid 4242 rose from 12.0 MiB to 110.0 MiB in 12.5 s (6 samples), and each of the 2 "
        "workers can grow the same way. The likely cause is copy-on-read: a forked worker that "
        "reads Python objects writes their reference counts, and every memory page written is "
        "copied into that worker. The largest Python container on the dataset is "
        f"dataset.paths (list[str], 200,000 items, about {size} MiB). Keep it in one shared "
        "buffer instead, in PathsDataset.__init__:\n"
        "    import stoker.sharing\n"
        "    self.paths = stoker.formats.SharedStrList(self.paths)\n"
        "Set STOKER_MEMORY_WATCH=0 to turn this check off."
    )


def test_a_jump_is_told_only_when_a_container_explains_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jump = mib(14, 100, 105, 105, 105)  # a list read in random order: copied in a second
    clock = [0.0]
    quiet = MemoryWatch(Shared(10), clock=lambda: clock[0], read_uss=lambda p: None)
    with told(caplog, expect=False):
        assert _growth(quiet, clock, 1, jump, workers=2) == [False] * 5
    big = PathsDataset(600_000)  # ~55 MiB of str: explains a 91 MiB jump (at least half)
    loud = MemoryWatch(big, clock=lambda: clock[0], read_uss=lambda p: None)
    with told(caplog) as record:
        assert _growth(loud, clock, 1, jump, workers=2) == [False] * 4 + [True]
    assert "dataset.paths (list[str], 600,000 items" in record[0]
    small = PathsDataset(200_000)  # ~18 MiB: does not
    with told(caplog, expect=False):
        watch = MemoryWatch(small, clock=lambda: clock[0], read_uss=lambda p: None)
        assert _growth(watch, clock, 1, jump, workers=2) == [False] * 5


def test_tells_once_per_watch(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    watch = MemoryWatch(PathsDataset(10), clock=lambda: clock[0], read_uss=lambda p: None)
    with told(caplog):
        _growth(watch, clock, 1, RAMP, workers=2)
    with told(caplog, expect=False):
        assert _growth(watch, clock, 2, RAMP, workers=2) == [False] * len(RAMP)
    assert watch.warned


def test_advice_without_a_container(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    watch = MemoryWatch(Shared(1000), clock=lambda: clock[0], read_uss=lambda p: None)
    with told(caplog) as record:
        _growth(watch, clock, 7, mib(20, 60, 100, 140, 180), workers=1)
    assert record[0] == (
        "stoker: DataLoader worker memory keeps growing: the private memory (USS) of worker "
        "pid 7 rose from 20.0 MiB to 180.0 MiB in 10.0 s (5 samples), and every worker can "
        "grow the same way. The dataset holds no Python container of 1 MiB or more, so this is "
        "not copy-on-read of its attributes: look for objects that __getitem__ keeps across "
        "calls (a cache, a list it appends to) or large module-level Python objects it reads. "
        "Set STOKER_MEMORY_WATCH=0 to turn this check off."
    )


def test_advice_for_a_dict_inside_a_subset(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    dataset = Subset(Records(50_000), [0, 1, 2])
    watch = MemoryWatch(dataset, clock=lambda: clock[0], read_uss=lambda p: None)
    with told(caplog) as record:
        _growth(watch, clock, 9, RAMP, workers=4)
    text = record[0]
    tail = text[text.index("The largest") :]
    est = find_largest_python_container(dataset)
    assert est is not None
    assert tail == (
        "The largest Python container on the dataset is dataset.dataset.index "
        f"(dict[str, tuple], 50,000 items, about {est[2] / MIB:.1f} MiB). Keep it in one "
        "shared buffer instead, in Records.__init__ (stoker has no shared dict: this keeps its "
        "(key, value) pairs by position):\n"
        "    import stoker.sharing\n"
        "    self.index = stoker.formats.SharedList(self.index.items())\n"
        "Set STOKER_MEMORY_WATCH=0 to turn this check off."
    )


# -- sampling cadence ------------------------------------------------------------------------


class FakeReader:
    """USS per pid from a table; each read advances the fake clock by ``cost_s``."""

    def __init__(self, clock: list[float], cost_s: float = 0.0) -> None:
        self.clock = clock
        self.cost_s = cost_s
        self.uss: dict[int, int] = {}
        self.reads: list[int] = []

    def __call__(self, pid: int) -> int | None:
        self.reads.append(pid)
        self.clock[0] += self.cost_s
        return self.uss.get(pid)


def test_sample_reads_one_worker_per_interval_round_robin() -> None:
    clock = [100.0]
    reader = FakeReader(clock)
    reader.uss = {11: 10 * MIB, 22: 10 * MIB}
    watch = MemoryWatch(Shared(10), interval_s=0.5, clock=lambda: clock[0], read_uss=reader)
    pids = (11, 22)
    for _ in range(10):  # new workers are read at once (their baselines), then not again
        watch.sample(pids)
    assert reader.reads == [11, 22]
    clock[0] += 0.5
    watch.sample(pids)
    clock[0] += 0.5
    watch.sample([11, 22])  # a list is fine too
    clock[0] += 0.2
    watch.sample(pids)  # not due
    assert reader.reads == [11, 22, 22, 11]
    reader.uss[33] = 10 * MIB
    watch.sample((22, 33))  # a restarted worker: its baseline at once; 11's series is dropped
    assert reader.reads == [11, 22, 22, 11, 33]
    assert set(watch._series) == {22, 33}


def test_slow_reads_stretch_the_interval() -> None:
    clock = [0.0]
    reader = FakeReader(clock, cost_s=0.05)  # 50 ms per read: next one after 5 s (1 %)
    reader.uss = {1: MIB}
    watch = MemoryWatch(Shared(10), interval_s=0.25, clock=lambda: clock[0], read_uss=reader)
    watch.sample((1,))  # the baseline
    watch.sample((1,))
    clock[0] += 4.9
    watch.sample((1,))
    assert len(reader.reads) == 1
    clock[0] += 0.2
    watch.sample((1,))
    assert len(reader.reads) == 2


def test_new_workers_start_new_series(caplog: pytest.LogCaptureFixture) -> None:
    """Non-persistent workers: each epoch's workers are new pids; old series are dropped, so
    growth is never computed across two different processes."""
    clock = [0.0]
    reader = FakeReader(clock)
    watch = MemoryWatch(PathsDataset(10), interval_s=1.0, clock=lambda: clock[0], read_uss=reader)
    with told(caplog, expect=False):
        for epoch, base in enumerate((10, 80, 150, 220, 290, 360)):  # each epoch +0 inside
            pid = 1000 + epoch
            reader.uss = {pid: base * MIB}
            for _ in range(3):
                clock[0] += 1.0
                watch.sample((pid,))
            assert set(watch._series) == {pid}
    assert not watch.warned


def test_sample_tells_of_growth_and_then_stops_reading(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    reader = FakeReader(clock)
    watch = MemoryWatch(PathsDataset(10), interval_s=1.0, clock=lambda: clock[0], read_uss=reader)
    with told(caplog):
        for v in RAMP:
            reader.uss = {5: v}
            clock[0] += 1.0
            watch.sample([5])
    reads = len(reader.reads)
    clock[0] += 10.0
    watch.sample([5])
    assert len(reader.reads) == reads


def test_unreadable_worker_is_skipped() -> None:
    clock = [0.0]
    reader = FakeReader(clock)  # no USS for any pid: gone or not ours
    watch = MemoryWatch(PathsDataset(10), interval_s=1.0, clock=lambda: clock[0], read_uss=reader)
    for _ in range(10):
        clock[0] += 1.0
        watch.sample((3,))
    assert watch._series == {} and not watch.warned


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_MEMORY_WATCH", "0")
    reader = FakeReader([0.0])
    watch = MemoryWatch(PathsDataset(10), read_uss=reader)
    watch.sample((1, 2))
    assert not watch.enabled and reader.reads == []


def test_long_series_are_thinned_keeping_first_and_last() -> None:
    clock = [0.0]
    watch = MemoryWatch(Shared(10), clock=lambda: clock[0], read_uss=lambda p: None)
    for k in range(1000):
        clock[0] = float(k)
        watch.record(1, MIB * (50 + (k % 2)))  # flat: never told
    series = watch._series[1]
    assert len(series.values) <= 65 and series.count == 1000
    assert series.values[0] == 50 * MIB and series.values[-1] == 51 * MIB
    assert series.first_at == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_read_uss_of_this_process() -> None:
    uss = read_uss(os.getpid())
    assert uss is not None and 10 * MIB < uss < 64 * 2**30
    assert read_uss(2**22 + 12345) is None  # above pid_max's default: no such process


# -- find_largest_python_container ----------------------------------------------------------


def test_finds_the_largest_attribute() -> None:
    found = find_largest_python_container(PathsDataset(10_000))
    assert found is not None
    path, kind, est = found
    assert (path, kind) == ("dataset.paths", "list[str]")
    real = sys.getsizeof(watch_list := PathsDataset(10_000).paths) + sum(
        sys.getsizeof(p) for p in watch_list
    )
    assert 0.8 * real < est < 1.2 * real


def test_walks_through_subset_and_concat() -> None:
    small, big = PathsDataset(100), PathsDataset(5000)
    concat = ConcatDataset([small, big])
    assert find_largest_python_container(Subset(big, [0]))[:2] == (  # type: ignore[index]
        "dataset.dataset.paths",
        "list[str]",
    )
    assert find_largest_python_container(concat)[:2] == (  # type: ignore[index]
        "dataset.datasets[1].paths",
        "list[str]",
    )
    assert find_largest_python_container(Subset(concat, [1]))[:2] == (  # type: ignore[index]
        "dataset.dataset.datasets[1].paths",
        "list[str]",
    )


def test_kinds() -> None:
    assert find_largest_python_container(Records(100))[:2] == (  # type: ignore[index]
        "dataset.index",
        "dict[str, tuple]",
    )
    assert find_largest_python_container(Slotted(1000))[:2] == (  # type: ignore[index]
        "dataset.blobs",
        "list[bytes]",
    )

    class ObjArray:
        def __init__(self) -> None:
            self.names = np.array([f"n{i}" for i in range(1000)], dtype=object)
            self.numbers = np.zeros(10**6)  # numpy numbers: not a Python container

    assert find_largest_python_container(ObjArray())[:2] == (  # type: ignore[index]
        "dataset.names",
        "ndarray[object]",
    )


def test_nothing_to_find() -> None:
    assert find_largest_python_container(TensorDataset(torch.zeros(1000, 10))) == (
        "dataset.tensors",
        "tuple[Tensor]",
        find_largest_python_container(TensorDataset(torch.zeros(1000, 10)))[2],  # type: ignore[index]
    )

    class Empty:
        pass

    assert find_largest_python_container(Empty()) is None
    # stoker's shared containers are not Python containers: only the small list is found
    found = find_largest_python_container(Shared(100_000))
    assert found is not None and found[0] == "dataset.classes"


class Record:
    def __init__(self, i: int) -> None:
        self.path = f"/data/train/{i:08d}.jpg"
        self.label = 1000 + i


class BrokenList(list):
    def __len__(self) -> int:
        raise RuntimeError("no length")


class RecordsDataset:
    def __init__(self, n: int) -> None:
        self.records = [Record(i) for i in range(n)]
        self.broken = BrokenList([1, 2, 3])


def test_objects_are_sized_with_their_attributes_and_odd_containers_skipped() -> None:
    dataset = RecordsDataset(5000)
    found = find_largest_python_container(dataset)
    assert found is not None
    path, kind, est = found
    assert (path, kind) == ("dataset.records", "list[Record]")
    real = sys.getsizeof(dataset.records) + sum(
        sys.getsizeof(r) + sys.getsizeof(vars(r)) + sys.getsizeof(r.path) + sys.getsizeof(r.label)
        for r in dataset.records
    )
    assert 0.8 * real < est < 1.2 * real
