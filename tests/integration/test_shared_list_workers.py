"""Shared containers in real worker processes: copy-on-read with a Python list vs none with
SharedStrList (fork), sharing without a copy under spawn, and MemoryWatch on real workers.

Worker memory is the USS (private memory) each worker has, read by the main process from
``/proc/<pid>/smaps_rollup``. Assertions are ratios of memory, never timings.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import warnings
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import Dataset

from stoker.profile.memory_watch import MIB, CopyOnReadWarning, GrowthRule, MemoryWatch, read_uss
from stoker.sharing import SharedStrList


@pytest.fixture(autouse=True)
def _beyond_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this module tests is beyond torch (NOTE [ Same as torch unless asked ]): asked
    for through the environment, as for a script that cannot be edited."""
    monkeypatch.setenv("STOKER_BEYOND_TORCH", "shared_lists")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/<pid>/smaps_rollup"
)

BLOCK_TIMEOUT_S = 60.0
N_PATHS = 300_000

if os.environ.get("STOKER_TEST_LOADER", "stoker").strip().lower() == "torch":
    DataLoader = torch.utils.data.DataLoader
else:
    try:
        from stoker import DataLoader
    except Exception:  # the engine is being rewritten: measure the containers on torch's
        DataLoader = torch.utils.data.DataLoader  # type: ignore[misc,assignment]


def make_paths(n: int, width: int = 0) -> list[str]:
    pad = "x" * width
    return [f"/data/train/class_{i % 1000}/img_{i:08d}{pad}.jpg" for i in range(n)]


class PathsDataset(Dataset):
    """``dataset[i]`` = (worker pid, UTF-8 length of path i, inode of the shared segment)."""

    def __init__(self, paths: Any, auto_share: bool = True) -> None:
        self.paths = paths
        if not auto_share:  # NOTE [ Automatic list sharing ] off: the plain list in workers
            self.stoker_share_lists = False

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        backing = getattr(self.paths, "_items", self.paths)  # a stand-in's source
        segment = getattr(backing, "_segment", None)
        inode = os.fstat(segment.fd).st_ino if segment is not None else 0
        return os.getpid(), len(self.paths[index].encode()), inode


def _children_uss() -> dict[int, int]:
    out = {}
    for child in psutil.Process().children():
        uss = read_uss(child.pid)
        if uss is not None:
            out[child.pid] = uss
    return out


def run_epoch(dataset: Dataset, **kwargs: Any) -> dict[str, Any]:
    """One epoch in order on persistent workers; each worker's USS after the first batch and
    after the last one (the workers are still up), and what the batches said.

    The garbage collector is frozen while the workers fork: otherwise a full collection in a
    worker writes the GC header of every tracked object the test process holds (pytest's and
    torch's, tens of MiB) and that copy-on-write would drown what this test measures.
    """
    gc.collect()
    gc.freeze()
    try:
        loader = DataLoader(
            dataset, batch_size=1000, persistent_workers=True, timeout=BLOCK_TIMEOUT_S, **kwargs
        )
        pids: set[int] = set()
        inodes: set[int] = set()
        total = 0
        before: dict[int, int] = {}
        for i, (pid, length, inode) in enumerate(loader):
            if i == 0:
                before = _children_uss()
            pids.update(pid.tolist())
            inodes.update(inode.tolist())
            total += int(length.sum())
        after = _children_uss()
        del loader
    finally:
        gc.unfreeze()
    return {"pids": pids, "before": before, "after": after, "inodes": inodes, "total": total}


def _growth(r: dict[str, Any]) -> int:
    assert len(r["pids"]) == 2 and r["pids"] <= set(r["before"]) & set(r["after"])
    return sum(r["after"][p] - r["before"][p] for p in r["pids"])


def test_shared_str_list_does_not_grow_forked_workers() -> None:
    paths = make_paths(N_PATHS)
    expected_total = sum(len(p.encode()) for p in paths)
    plain = run_epoch(
        PathsDataset(paths, auto_share=False), num_workers=2, multiprocessing_context="fork"
    )
    shared = run_epoch(
        PathsDataset(SharedStrList(paths)), num_workers=2, multiprocessing_context="fork"
    )
    assert plain["total"] == shared["total"] == expected_total
    list_growth, shared_growth = _growth(plain), _growth(shared)
    # 300,000 str objects (~28 MiB) are copied page by page into the workers that read them
    assert list_growth > 16 * MIB, f"list: workers grew by {list_growth / MIB:.1f} MiB"
    assert shared_growth < list_growth / 3, (
        f"workers grew by {shared_growth / MIB:.1f} MiB with SharedStrList, "
        f"{list_growth / MIB:.1f} MiB with a list"
    )


@pytest.mark.skipif(DataLoader is torch.utils.data.DataLoader, reason="stoker's own feature")
def test_a_plain_list_is_shared_with_forked_workers_automatically() -> None:
    paths = make_paths(N_PATHS)  # held here too, so the workers get a shared container
    opted_out = run_epoch(
        PathsDataset(paths, auto_share=False), num_workers=2, multiprocessing_context="fork"
    )
    automatic = run_epoch(PathsDataset(paths), num_workers=2, multiprocessing_context="fork")
    assert automatic["total"] == opted_out["total"] == sum(len(p.encode()) for p in paths)
    assert len(automatic["inodes"] - {0}) == 1  # the workers read one shared segment
    assert opted_out["inodes"] == {0}  # ... and with the opt-out, the plain list
    list_growth, auto_growth = _growth(opted_out), _growth(automatic)
    assert list_growth > 16 * MIB, f"list: workers grew by {list_growth / MIB:.1f} MiB"
    assert auto_growth < list_growth / 3, (
        f"workers grew by {auto_growth / MIB:.1f} MiB with the list shared automatically, "
        f"{list_growth / MIB:.1f} MiB without"
    )


class OwnPathsDataset(Dataset):
    """Builds its list and is its only holder; ``dataset[i]`` = (worker pid, UTF-8 length of
    path i, 1 if the worker reads the list in place else 0)."""

    def __init__(self, n: int, auto_share: bool = True) -> None:
        self.paths = make_paths(n)
        if not auto_share:
            self.stoker_share_lists = False

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        in_place = type(getattr(self.paths, "_items", None)).__name__ == "InheritedList"
        return os.getpid(), len(self.paths[index].encode()), int(in_place)


@pytest.mark.skipif(DataLoader is torch.utils.data.DataLoader, reason="stoker's own feature")
def test_a_list_only_the_dataset_holds_is_read_in_place_by_forked_workers() -> None:
    """NOTE [ Reading inherited lists in place ]: no container, no copy, nothing grows."""
    from stoker.sharing import inherited_list

    if not inherited_list.available():
        pytest.skip("this interpreter's object layout is not read")
    opted_out = run_epoch(
        OwnPathsDataset(N_PATHS, auto_share=False), num_workers=2, multiprocessing_context="fork"
    )
    in_place = run_epoch(OwnPathsDataset(N_PATHS), num_workers=2, multiprocessing_context="fork")
    assert in_place["total"] == opted_out["total"] == sum(len(p) for p in make_paths(N_PATHS))
    assert in_place["inodes"] == {1} and opted_out["inodes"] == {0}
    list_growth, in_place_growth = _growth(opted_out), _growth(in_place)
    assert list_growth > 16 * MIB, f"list: workers grew by {list_growth / MIB:.1f} MiB"
    assert in_place_growth < list_growth / 3, (
        f"workers grew by {in_place_growth / MIB:.1f} MiB reading the list in place, "
        f"{list_growth / MIB:.1f} MiB reading it as a list"
    )


def test_spawned_workers_map_the_segment_instead_of_copying_it() -> None:
    big = SharedStrList(make_paths(200_000, width=500))  # ~100 MiB of UTF-8
    assert big.nbytes > 90 * MIB
    parent_inode = os.fstat(big._segment.fd).st_ino
    small = SharedStrList(make_paths(1000))
    with_big = run_epoch(PathsDataset(big), num_workers=1, multiprocessing_context="spawn")
    with_small = run_epoch(PathsDataset(small), num_workers=1, multiprocessing_context="spawn")
    assert with_big["inodes"] == {parent_inode}  # the worker reads the parent's segment
    assert with_big["total"] == sum(len(p) for p in big)

    def uss(r: dict[str, Any]) -> int:
        (pid,) = r["pids"]
        return r["after"][pid]

    extra = uss(with_big) - uss(with_small)
    # a copy would cost the worker the whole buffer (and more, while unpickling)
    assert extra < big.nbytes / 4, (
        f"the worker holding {big.nbytes / MIB:.0f} MiB of SharedStrList has "
        f"{extra / MIB:.1f} MiB more private memory than one holding a tiny one"
    )


SAMPLE_EVERY_BATCHES = 25


def test_memory_watch_names_the_list_on_real_workers(caplog: pytest.LogCaptureFixture) -> None:
    """MemoryWatch driven as the loader will drive it: sample(worker_pids) after each batch.
    The rule is scaled to this small dataset (the default floor is 64 MiB).

    The watch's clock counts batches, so a USS read is due every 25th batch: 24 reads over
    the epoch (12 per worker), whatever a read costs. On the wall clock (a read due after
    twice the last one's duration) the number of reads was the epoch's time over the cost of
    reading /proc/<pid>/smaps_rollup, which grows with the resident memory of the process
    that forked the workers: late in a full run (a large pytest process, a busy machine) a
    worker got 4 reads, under ``min_samples``, and no warning came.

    The advice is a WARNING record on the watch's logger and the text given to ``tell`` (the
    loader's stats), never a ``warnings`` warning (issue 44)."""
    dataset = PathsDataset(make_paths(N_PATHS), auto_share=False)
    rule = GrowthRule(min_samples=5, min_growth_bytes=4 * MIB)
    batches_seen = 0
    told: list[str] = []
    watch = MemoryWatch(
        dataset, rule, interval_s=SAMPLE_EVERY_BATCHES, clock=lambda: float(batches_seen),
        tell=told.append,
    )
    loader = DataLoader(
        dataset,
        batch_size=500,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        timeout=BLOCK_TIMEOUT_S,
    )
    pids: tuple[int, ...] = ()
    with caplog.at_level(logging.DEBUG, "stoker.profile.memory_watch"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        for pid, _, _ in loader:
            if len(pids) < 2:
                pids = tuple(sorted({*pids, *pid.tolist()}))
            watch.sample(pids)
            batches_seen += 1
    del loader
    found = [r for r in caplog.records if getattr(r, "category", None) is CopyOnReadWarning]
    series_mib = {p: [round(v / MIB, 1) for v in s.values] for p, s in watch._series.items()}
    assert len(found) == 1, ([r.getMessage() for r in caplog.records], series_mib)
    text = found[0].getMessage()
    assert told == [text]
    assert "The largest Python container on the dataset is dataset.paths (list[str], 300,000" in (
        text
    )
    assert text.endswith(
        "in PathsDataset.__init__:\n"
        "    import stoker.sharing\n"
        "    self.paths = stoker.formats.SharedStrList(self.paths)\n"
        "Set STOKER_MEMORY_WATCH=0 to turn this check off."
    )
    assert (found[0].name, found[0].levelno) == ("stoker.profile.memory_watch", logging.DEBUG)
