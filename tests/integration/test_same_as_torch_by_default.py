"""Issue 30: with default arguments a program sees what torch's DataLoader gives it. Each test
runs the same script through torch's DataLoader and the loader under test, in the same process,
and compares everything the script can see; each failed on facd28b.

Under ``STOKER_TEST_LOADER=torch`` both sides are torch's: the expectations are torch's own.
"""

from __future__ import annotations

import copy
import gc
import multiprocessing
import random
from typing import Any

import numpy as np
import pytest
import torch
from _default_datasets import (
    Arrays,
    BatchesByKey,
    CountingBatchSampler,
    CountingSampler,
    CtrlCAtThird,
    DrawsWhenPickled,
    Noisy,
    Paths,
    ReadsSampler,
    Seeds,
    ShuffledShards,
    WhoLoads,
    add_hundred,
    where_collated,
)

import stoker


def _plain(batch: Any) -> Any:
    """A batch as plain, comparable values."""
    if isinstance(batch, torch.Tensor):
        return (str(batch.dtype), batch.tolist())
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [_plain(b) for b in batch])
    return batch


def _epochs(loader: Any, epochs: int = 2) -> list[list[Any]]:
    return [[_plain(b) for b in loader] for _ in range(epochs)]


def _both(Loader: type, TorchLoader: type, script: Any) -> None:
    """Run ``script(LoaderClass)`` for torch's loader and the one under test; same result."""
    expected = script(TorchLoader)
    got = script(Loader)
    assert got == expected


# 1
def test_persistent_workers_keep_the_dataset_they_started_with(Loader, TorchLoader):
    def script(cls: type) -> list:
        ds = Arrays()
        loader = cls(ds, batch_size=16, num_workers=2, persistent_workers=True, timeout=60)
        first = [_plain(b) for b in loader]
        ds.x[:] = -1.0  # the script changes its arrays between epochs
        return [first, [_plain(b) for b in loader]]

    _both(Loader, TorchLoader, script)


# 2
def test_a_worker_init_fn_and_collate_fn_set_after_the_first_epoch_run(Loader, TorchLoader):
    def script(cls: type) -> list:
        loader = cls(Arrays(), batch_size=16, num_workers=2, timeout=60)
        first = [_plain(b) for b in loader]
        loader.worker_init_fn = add_hundred
        second = [_plain(b) for b in loader]
        loader.collate_fn = where_collated
        third = [_plain(b) for b in loader]
        return [first, second, third]

    _both(Loader, TorchLoader, script)


# 3
@pytest.mark.parametrize("num_workers", [0, 2])
def test_seeds_and_draws_inside_workers_are_torchs(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        torch.manual_seed(11)
        random.seed(11)
        np.random.seed(11)
        loader = cls(Seeds(), batch_size=4, shuffle=True, num_workers=num_workers,
                     generator=torch.Generator().manual_seed(5), timeout=60 if num_workers else 0)
        return _epochs(loader)

    _both(Loader, TorchLoader, script)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shards_shuffled_with_random_in_iter_come_in_torchs_order(
    Loader, TorchLoader, num_workers
):
    def script(cls: type) -> list:
        random.seed(3)
        torch.manual_seed(3)
        loader = cls(ShuffledShards(), batch_size=3, num_workers=num_workers,
                     timeout=60 if num_workers else 0)
        return _epochs(loader)

    _both(Loader, TorchLoader, script)


# 4
def test_in_process_loading_leaves_the_scripts_rng_streams_as_torch_does(Loader, TorchLoader):
    def script(cls: type) -> list:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        loader = cls(Noisy(), batch_size=4, shuffle=True)
        epochs = _epochs(loader)
        after = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
        return [epochs, after]

    _both(Loader, TorchLoader, script)


# 5
@pytest.mark.parametrize("set_epoch", [None, 0])
def test_a_distributed_sampler_is_advanced_only_by_the_script(Loader, TorchLoader, set_epoch):
    def script(cls: type) -> list:
        ds = Arrays(40)
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True)
        loader = cls(ds, batch_size=5, sampler=sampler)
        out = []
        for _ in range(3):
            if set_epoch is not None:
                sampler.set_epoch(set_epoch)
            out.append([_plain(b) for b in loader])
        return out

    _both(Loader, TorchLoader, script)


# 6
def _slab_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("stoker-slab" in line for line in f)


def test_a_finished_loader_keeps_no_shared_memory(stoker_only):
    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 128

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((3, 64, 64), float(i))

    before = _slab_mappings()
    loaders = [stoker.DataLoader(Images(), batch_size=32, num_workers=2, timeout=60)
               for _ in range(3)]
    for loader in loaders:  # three validation loaders, each run to its end
        for batch in loader:
            del batch
    gc.collect()
    assert _slab_mappings() == before  # torch frees an epoch's batches when it ends
    kept = stoker.DataLoader(Images(), batch_size=32, num_workers=2, timeout=60,
                             beyond_torch={"keep_slabs"})
    for batch in kept:
        del batch
    gc.collect()
    assert _slab_mappings() > before  # the opt-in keeps them for the next epoch
    del kept, loaders
    gc.collect()
    assert _slab_mappings() == before


# 8
def test_a_large_list_is_a_list_inside_workers(Loader, TorchLoader):
    def script(cls: type) -> list:
        loader = cls(Paths(), batch_size=4, sampler=range(0, 70_000, 7_000), num_workers=2,
                     timeout=60)
        return [_plain(b) for b in loader]

    _both(Loader, TorchLoader, script)


# 9
def test_prefetch_factor_zero_with_workers_is_refused_at_iter_as_torch_does(Loader):
    loader = Loader(Arrays(20), batch_size=2, num_workers=2, prefetch_factor=0)
    assert len(loader) == 10
    with pytest.raises(AssertionError) as info:
        iter(loader)
    # torch's text (a note may follow it: pytest's match reads the notes too)
    assert str(info.value) == (
        "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter")


# 10
@pytest.mark.parametrize("straggle_cpu_s", [0.0, 0.6])
def test_batch_k_is_loaded_by_worker_k_mod_num_workers(Loader, straggle_cpu_s):
    loader = Loader(WhoLoads(straggle_cpu_s), batch_size=4, num_workers=3, timeout=60)
    for k, (_, workers) in enumerate(loader):
        assert workers.tolist() == [k % 3] * 4, k


# 11
@pytest.mark.parametrize("persistent", [False, True])
def test_torchs_own_classes_are_read_from_the_copy_each_worker_started_with(
        Loader, TorchLoader, persistent):
    """A batch of torch's own classes is one gather (NOTE [ torch's own datasets ]), made in
    the main process from the copy it took as the workers started (NOTE [ Gathers read the
    workers' starting copy ]), as torch's workers read theirs: the script's changes in place
    after the workers started (mid-epoch; between epochs with persistent workers) are not in
    the batches, neither through torch nor through a numpy view of the tensor (which torch's
    version counter does not see). Gathering from the live tensors instead would show them:
    that is ``inline_gathers``, beyond torch."""
    def script(cls: type) -> list:
        x = torch.arange(64.0).reshape(32, 2)
        y = torch.arange(32)
        ds = torch.utils.data.TensorDataset(x, y)
        loader = cls(ds, batch_size=4, shuffle=True, num_workers=2,
                     persistent_workers=persistent, timeout=60,
                     generator=torch.Generator().manual_seed(5))
        out = []
        for _ in range(2):
            epoch = []
            for i, batch in enumerate(loader):
                epoch.append(_plain(batch))
                if i == 1:
                    x.mul_(-1)  # in place, after the workers forked
                    y.numpy()[:] += 100  # through a numpy view: no version bump
            out.append(epoch)
        return out

    _both(Loader, TorchLoader, script)


# found by a blind sweep of ordinary programs: stoker's __iter__ went around a subclass's own
# _get_iterator
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subclass_that_makes_its_own_iterators_gets_them(Loader, TorchLoader, num_workers):
    from torch.utils.data.dataloader import (
        _MultiProcessingDataLoaderIter,
        _SingleProcessDataLoaderIter,
    )

    base = _MultiProcessingDataLoaderIter if num_workers else _SingleProcessDataLoaderIter

    class Tagged(base):  # type: ignore[misc, valid-type]
        def _next_data(self) -> Any:
            return ("tagged", super()._next_data())

    def script(cls: type) -> list:
        class Tagging(cls):  # type: ignore[misc, valid-type]
            def _get_iterator(self) -> Any:
                return Tagged(self)

        loader = Tagging(list(range(8)), batch_size=2, num_workers=num_workers,
                         persistent_workers=bool(num_workers), timeout=60 if num_workers else 0)
        epochs = [[(tag, batch.tolist()) for tag, batch in loader] for _ in range(2)]
        del loader
        gc.collect()  # torch's iterator shuts its persistent workers down when collected
        return epochs

    _both(Loader, TorchLoader, script)


# found beside the one above: a subclass whose _get_iterator returns super()'s iterator kept
# it with persistent workers, and the next pass called torch's _reset on stoker's iterator
def test_a_subclass_that_returns_the_loaders_own_persistent_iterator_goes_on(
    Loader, TorchLoader
):
    def script(cls: type) -> list:
        made = []

        class Counting(cls):  # type: ignore[misc, valid-type]
            def _get_iterator(self) -> Any:
                made.append(len(made))
                return super()._get_iterator()

        loader = Counting(list(range(6)), batch_size=2, num_workers=2, persistent_workers=True,
                          timeout=60)
        epochs = [[batch.tolist() for batch in loader] for _ in range(3)]
        del loader
        gc.collect()
        return [epochs, made]

    _both(Loader, TorchLoader, script)


# NOTE [ torch's iterator classes ]: frameworks tell torch's iterators by class (Lightning's
# CombinedLoader pickles without them, and shuts a multiprocessing one's workers down)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_iterator_is_an_instance_of_torchs_iterator_classes(
    Loader, TorchLoader, num_workers
):
    from torch.utils.data import dataloader

    kinds = (dataloader._BaseDataLoaderIter, dataloader._SingleProcessDataLoaderIter,
             dataloader._MultiProcessingDataLoaderIter)

    def script(cls: type) -> list:
        loader = cls(list(range(6)), batch_size=2, num_workers=num_workers,
                     persistent_workers=bool(num_workers), timeout=60 if num_workers else 0)
        it = iter(loader)
        first = next(it).tolist()
        facts = [first, [isinstance(it, kind) for kind in kinds], len(it)]
        if num_workers:
            workers = list(it._workers)
            it._shutdown_workers()  # as Lightning does at the end of a fit
            facts.append([w.is_alive() for w in workers])
        del it, loader
        gc.collect()
        return facts

    _both(Loader, TorchLoader, script)


# found by a blind sweep: with workers an empty batch asked for by the batch sampler was taken
# for one whose samples were all skipped (on_error="skip", never set): not yielded, and warned
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_an_empty_batch_from_the_batch_sampler_is_collated(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        import warnings

        loader = cls(list(range(10)), batch_sampler=[[], [1], [2, 3], []],
                     num_workers=num_workers, collate_fn=len, timeout=60 if num_workers else 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = [list(loader) for _ in range(2)]
        return [batches, [str(w.message) for w in caught]]

    _both(Loader, TorchLoader, script)


def _rows_datasets() -> dict[str, Any]:
    return {
        "tensors": torch.utils.data.TensorDataset(torch.arange(24.).view(12, 2), torch.arange(12)),
        "concat": torch.utils.data.ConcatDataset(
            [torch.utils.data.TensorDataset(torch.arange(12.).view(6, 2)),
             torch.utils.data.TensorDataset(torch.arange(12.).view(6, 2) + 100)]),
    }


# found by a blind sweep: the batches of torch's own dataset classes took inference_mode from
# the iter() that gathered them ahead (main-process gathers), not from the next() that hands
# them out, and their version counters were one higher than torch's. One worker: with two,
# which batch torch's loop takes off its queue inside the inference_mode next() is timing
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("name", ["tensors", "concat"])
def test_a_gathered_batch_is_made_at_the_next_that_hands_it_out(
    Loader, TorchLoader, num_workers, name
):
    def facts(batch: Any) -> list:
        x = batch[0]
        version = None if x.is_inference() else x._version  # not tracked for those
        try:
            x.add_(1)
            inplace = "ok"
        except RuntimeError as exc:
            inplace = str(exc).split(".")[0]
        return [x.is_inference(), version, inplace]

    def script(cls: type) -> list:
        loader = cls(_rows_datasets()[name], batch_size=4, shuffle=True, num_workers=num_workers,
                     generator=torch.Generator().manual_seed(0))
        out = []
        with torch.inference_mode():
            it = iter(loader)
        out.append(facts(next(it)))
        with torch.inference_mode():
            out.append(facts(next(it)))
        out.append([facts(b) for b in it])
        return out

    _both(Loader, TorchLoader, script)


# found by a blind sweep: a profiler's trace listed stoker's own operators (the gathers'
# index_select, the sampler's numpy view, the transport's copies) where torch's lists its own
@pytest.mark.parametrize(("name", "num_workers", "after_iter"), [
    ("tensors", 0, False), ("concat", 0, True), ("tensors", 2, False), ("tensors", 2, True),
    ("list", 0, False),
])
def test_a_profiler_lists_torchs_operators(Loader, TorchLoader, name, num_workers, after_iter):
    import collections

    from torch.profiler import ProfilerActivity, profile

    def script(cls: type) -> list:
        dataset = list(range(12)) if name == "list" else _rows_datasets()[name]
        torch.manual_seed(0)
        loader = cls(dataset, batch_size=4, shuffle=True, num_workers=num_workers,
                     timeout=60 if num_workers else 0)
        it = iter(loader) if after_iter else None
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            batches = [b.tolist() if name == "list" else b[0].tolist()
                       for b in (it if it is not None else loader)]
        names = collections.Counter(e.name for e in prof.events())
        return [batches, sorted(names.items())]

    _both(Loader, TorchLoader, script)


# found by two blind sweeps: a map-style loader's workers exited once the sampler was spent
# and their tasks answered, mid-epoch; torch's live until the epoch ends (a worker whose
# iterable ended exits at once under both)
@pytest.mark.parametrize("num_workers", [3])
def test_workers_live_until_the_epoch_ends(Loader, TorchLoader, num_workers):
    import multiprocessing
    from multiprocessing.connection import wait

    def script(cls: type) -> list:
        loader = cls(list(range(10)), batch_size=1, num_workers=num_workers, timeout=60)
        alive = []
        it = iter(loader)
        for _ in range(10):
            next(it)
            alive.append(len(multiprocessing.active_children()))
        # after the last batch: none has exited (one told to stop would, well within 1 s;
        # the wait passes in full where they all live, and can only pass early on a bug)
        exited = wait([w.sentinel for w in it._workers], timeout=1.0)
        with pytest.raises(StopIteration):
            next(it)
        del it, loader
        gc.collect()
        return [alive, len(exited)]

    _both(Loader, TorchLoader, script)


# found by a blind sweep: a subclass's own attributes named as stoker's additions broke
# iteration (self.plan = ... made stoker's self.plan() a str call; dist_context refused)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subclass_may_use_the_names_stoker_adds(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        class Scheduled(cls):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.plan = "warmup"
                self.dist_context = {"rank": 3}
                self.stats = [1, 2]

        loader = Scheduled(list(range(6)), batch_size=2, num_workers=num_workers,
                           timeout=60 if num_workers else 0)
        epochs = [[b.tolist() for b in loader] for _ in range(2)]
        return [epochs, loader.plan, loader.dist_context, loader.stats]

    _both(Loader, TorchLoader, script)


# found by a blind sweep: batches gathered in the main process sent no task to their worker,
# so the main process lacked the QueueFeederThread torch's first put to a worker starts
def test_gathered_batches_leave_torchs_threads_in_the_main_process(Loader, TorchLoader):
    import threading

    def script(cls: type) -> list:
        loader = cls(torch.utils.data.TensorDataset(torch.arange(8)), batch_size=2,
                     num_workers=2, timeout=60)
        it = iter(loader)
        seen = [sorted(t.name for t in threading.enumerate())]
        for batch in it:
            seen.append([batch[0].tolist(), sorted(t.name for t in threading.enumerate())])
        del it, loader
        gc.collect()
        return seen

    _both(Loader, TorchLoader, script)


# found by a blind sweep: torch's _workers are multiprocessing's process objects (name, daemon,
# ident read by programs that log them); and an iterator without workers has no _workers
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_iterators_workers_answer_as_process_objects(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        loader = cls(list(range(10)), batch_size=3, num_workers=num_workers,
                     timeout=60 if num_workers else 0)
        it = iter(loader)
        next(it)
        if not hasattr(it, "_workers"):
            return ["no _workers"]
        def kind(w: Any) -> str:  # Process-N: N counts every process this one made
            return w.name.rsplit("-", 1)[0]

        facts = [[kind(w), w.daemon, type(w.ident).__name__, w.is_alive()] for w in it._workers]
        rest = [b.tolist() for b in it]
        return [facts, rest, [kind(w) for w in it._workers]]

    _both(Loader, TorchLoader, script)


def _warned_at(deepest: int) -> list[str]:
    """Where a warning from the caller, with each stacklevel up to ``deepest`` (1: the
    caller's own line), is attributed: file, line and the module ``module=`` filters match."""
    import os
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for level in range(1, deepest + 1):
            warnings.warn(f"level {level}", UserWarning, stacklevel=level + 1)
    return [f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught]


class _Warns:
    """Warns from ``__getitem__`` (or ``__getitems__``, or a stream's generator) and returns
    where each warning was attributed (NOTE [ torch's fetchers call the dataset ]): up to
    torch's line that calls its fetcher (``_next_data``'s, or ``_worker_loop``'s)."""

    deepest = 3  # __getitems__ or a stream: fetch, then torch's line that calls it

    def _where(self) -> list[str]:
        return _warned_at(self.deepest + 1)


class WarnsMap(_Warns, torch.utils.data.Dataset):
    deepest = 4  # and torch's list comprehension

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> list[str]:
        return self._where()


class WarnsGetitems(WarnsMap):
    def __getitems__(self, indices: list[int]) -> list[list[str]]:
        return [self._where() for _ in indices]


class WarnsStream(_Warns, torch.utils.data.IterableDataset):
    def __iter__(self):
        for _ in range(4):
            yield self._where()


def _no_collate(batch: Any) -> Any:
    return batch


def _warning_collate(batch: Any) -> Any:
    return [batch, _warned_at(3)]


# found by blind sweeps: a warning raised with stacklevel=2 in __getitem__ or collate_fn named
# stoker's fetcher where torch's names its fetch.py line (its text on stderr, module= filters);
# one level more, torch's line that calls the fetcher
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["map", "getitems", "stream", "unbatched", "collate"])
def test_a_warning_from_the_dataset_is_attributed_to_torchs_fetcher(
        Loader, TorchLoader, num_workers, kind):
    def script(cls: type) -> list:
        dataset = {"map": WarnsMap, "getitems": WarnsGetitems, "stream": WarnsStream,
                   "unbatched": WarnsMap, "collate": WarnsMap}[kind]()
        batch_size = None if kind == "unbatched" else 2
        if kind == "unbatched":
            dataset.deepest = 3  # no list comprehension
        collate_fn = _warning_collate if kind == "collate" else _no_collate
        loader = cls(dataset, batch_size=batch_size, num_workers=num_workers,
                     collate_fn=collate_fn, timeout=60 if num_workers else 0)
        return [batch for batch in loader]

    _both(Loader, TorchLoader, script)


class WarnsInSampler(torch.utils.data.Sampler):
    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __iter__(self):
        for i in range(4):
            self.seen.append(_warned_at(3))  # the sampler, torch's BatchSampler, _next_index
            yield i

    def __len__(self) -> int:
        return 4


class InitWarnings(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> list[str]:
        return self.seen


def _init_warns(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.seen = _warned_at(2)


# found by a blind sweep: next() on the sampler and worker_init_fn are called from torch's own
# lines (_next_index's, _worker_loop's): a warning one level up is attributed there
@pytest.mark.parametrize("num_workers", [0, 2])
def test_warnings_from_the_sampler_and_worker_init_fn_are_attributed_as_torchs(
        Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        sampler = WarnsInSampler()
        loader = cls(InitWarnings(), batch_size=2, sampler=sampler, num_workers=num_workers,
                     collate_fn=_no_collate, timeout=60 if num_workers else 0,
                     worker_init_fn=_init_warns if num_workers else None)
        return [[batch for batch in loader], sampler.seen]

    _both(Loader, TorchLoader, script)


class BatchesWarnAtIter(torch.utils.data.Sampler):
    """A batch sampler whose ``__iter__`` is a plain function: it runs at ``iter()``, so a
    warning one level up is attributed to the line of torch's loader that calls ``iter``."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __iter__(self):
        self.seen.append(_warned_at(2))
        return iter([[0, 1], [2, 3]])

    def __len__(self) -> int:
        return 2


# found by a blind sweep: stoker called iter(batch_sampler) from its cursor, so such a warning
# named stoker's file, and the once-per-location filter hid the second call's (torch makes it
# from another line, its _reset's)
@pytest.mark.parametrize("workers", ["none", "two", "persistent"])
def test_a_warning_from_the_samplers_iter_is_attributed_as_torchs(Loader, TorchLoader, workers):
    def script(cls: type) -> list:
        sampler = BatchesWarnAtIter()
        num_workers = 0 if workers == "none" else 2
        loader = cls(InitWarnings(), batch_sampler=sampler, num_workers=num_workers,
                     persistent_workers=workers == "persistent", collate_fn=_no_collate,
                     timeout=60 if num_workers else 0)
        epochs = [[batch for batch in loader] for _ in range(2)]
        return [epochs, sampler.seen]

    _both(Loader, TorchLoader, script)


class LenWarns(torch.utils.data.Dataset):
    """``__len__`` records where a warning one level up is attributed: the line of torch's
    sampler that asks the length (``SequentialSampler.__iter__``, ``RandomSampler.__iter__``)."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def __len__(self) -> int:
        self.seen.append(_warned_at(2))
        return 4

    def __getitem__(self, i: int) -> int:
        return i


# found by a blind sweep: stoker's fast batch sampler called len(dataset) itself, so a warning
# from __len__ named stoker's file where torch's names its sampler's line
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_warning_from_the_datasets_len_is_attributed_as_torchs(Loader, TorchLoader, shuffle):
    def script(cls: type) -> list:
        dataset = LenWarns()
        loader = cls(dataset, batch_size=2, shuffle=shuffle,
                     generator=torch.Generator().manual_seed(0))
        epochs = [[batch.tolist() for batch in loader] for _ in range(2)]
        return [epochs, dataset.seen]

    _both(Loader, TorchLoader, script)


class HoldsALock(torch.utils.data.Dataset):
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


# found by a blind sweep: torch warns as it re-raises a worker start's pickle error
def test_a_worker_that_cannot_be_pickled_gets_torchs_warning(Loader, TorchLoader):
    def script(cls: type) -> list:
        import os
        import warnings

        loader = cls(HoldsALock(), batch_size=2, num_workers=1, timeout=60,
                     multiprocessing_context="spawn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(TypeError) as raised:
                iter(loader)
        return [str(raised.value), [(w.category.__name__, str(w.message),
                                     os.path.basename(w.filename), w.lineno) for w in caught]]

    _both(Loader, TorchLoader, script)


# found by a blind sweep: torch's iterators refuse pickling with two arguments, naming its class
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pickling_an_iterator_raises_torchs_error(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        import pickle

        it = iter(cls(list(range(4)), batch_size=2, num_workers=num_workers,
                      timeout=60 if num_workers else 0))
        with pytest.raises(NotImplementedError) as raised:
            pickle.dumps(it)
        return [raised.value.args, [b.tolist() for b in it]]

    _both(Loader, TorchLoader, script)


class Delegating(torch.utils.data.Dataset):
    """A wrapper that forwards unknown names to what it wraps, and records each name it is
    asked for through ``__getattr__``."""

    def __init__(self) -> None:
        self.inner = list(range(6))
        self.asked: list[str] = []

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> list[str]:
        return sorted(set(self.asked))

    def __getattr__(self, name: str) -> Any:
        self.__dict__.setdefault("asked", []).append(name)
        return getattr(self.__dict__["inner"], name)


# found by a sweep: stoker asked a delegating dataset's __getattr__ for its own hook names
# (stoker_prepare_batch, stoker_thread_safe...), which torch never asks for. One difference
# is left: where the class has its own __getattr__, stoker asks __getitems__ once more as it
# builds a fetcher (torch asks only at every batch), so the names are compared, not counted.
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_delegating_dataset_is_asked_for_torchs_names_only(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        dataset = Delegating()
        loader = cls(dataset, batch_size=2, num_workers=num_workers, collate_fn=_no_collate,
                     timeout=60 if num_workers else 0)
        batches = [batch for batch in loader]
        return [batches, sorted(set(dataset.asked))]

    _both(Loader, TorchLoader, script)


class CodeAndDetailError(Exception):
    """A constructor with two arguments: torch cannot rebuild it from its message."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)


class SkipsBadRecords(torch.utils.data.Dataset):
    """Records 2, 4 and 6 fail with errors torch turns into RuntimeError in a worker."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 2:
            import json

            json.loads("{bad record")
        if i == 4:
            b"\xff".decode("utf-8")
        if i == 6:
            raise CodeAndDetailError(6, "corrupt")
        return i


# The sharpest edge of a worker's exception: the except clause that catches it. A script that
# skips bad records with `except RuntimeError` goes on under torch, and so must it under stoker
# (NOTE [ A worker's exception has torch's type ]); `except ValueError` catches none of them.
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_worker_error_is_caught_by_the_except_clause_that_catches_torchs(
        Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        it = iter(cls(SkipsBadRecords(), batch_size=None, num_workers=num_workers,
                      timeout=60 if num_workers else 0))
        seen: list[Any] = []
        for _ in range(8):
            try:
                seen.append(int(next(it)))
            except ValueError as exc:
                seen.append(("ValueError", type(exc).__name__))
            except RuntimeError as exc:
                seen.append(("RuntimeError", type(exc).__name__, str(exc).splitlines()[0],
                             exc.args == (str(exc),)))
            except Exception as exc:  # noqa: BLE001 -- the two-argument one without workers
                seen.append(("Exception", type(exc).__name__, exc.args))
        return seen

    _both(Loader, TorchLoader, script)


def cannot_open_db(worker_id: int) -> None:
    raise OSError("cannot open the database")


# found by a sweep: after worker_init_fn raised, stoker's worker raised that error again for
# every batch, where torch's raises UnboundLocalError (it has no fetcher), and a persistent
# worker of torch's loads again at the next epoch (NOTE [ After worker_init_fn raised ]).
@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_whose_init_fn_raised_goes_on_as_torchs(Loader, TorchLoader, persistent):
    def script(cls: type) -> list:
        loader = cls(list(range(6)), batch_size=2, num_workers=1, timeout=60,
                     persistent_workers=persistent, worker_init_fn=cannot_open_db)
        epochs = []
        for _ in range(2):
            seen: list[Any] = []
            it = iter(loader)
            while True:
                try:
                    seen.append(next(it).tolist())
                except StopIteration:
                    break
                except Exception as exc:  # noqa: BLE001 -- the type is what is compared
                    seen.append(type(exc).__name__)
            epochs.append(seen)
        return epochs

    _both(Loader, TorchLoader, script)


class Finalised:
    """Records, in the script's list, when the loader let go of it."""

    def __init__(self, tag: str, gone: list[str]) -> None:
        self.tag, self.gone = tag, gone

    def __del__(self) -> None:
        self.gone.append(self.tag)


class FinalisedDataset(Finalised, torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


class FinalisedCollate(Finalised):
    def __call__(self, batch: list[int]) -> torch.Tensor:
        return torch.tensor(batch)


class FinalisedInit(Finalised):
    def __call__(self, worker_id: int) -> None:
        pass


class FinalisedSampler(Finalised, torch.utils.data.Sampler):
    def __iter__(self):  # noqa: ANN204
        return iter(range(4))

    def __len__(self) -> int:
        return 4


# found by sweeps: stoker's engine state held the dataset past the loader's own attribute, so
# the program's objects went in another order (NOTE [ What the loader lets go of first ]); a
# persistent iterator, the last to hold them, let go of them in the reverse of torch's order
# (NOTE [ What the iterator lets go of ])
@pytest.mark.parametrize("workers", [{}, {"num_workers": 1, "persistent_workers": True}],
                         ids=["no_workers", "persistent"])
@pytest.mark.parametrize("iterated", [False, True])
def test_a_deleted_loader_lets_go_of_the_programs_objects_in_torchs_order(
        Loader, TorchLoader, iterated, workers):
    def script(cls: type) -> list:
        gone: list[str] = []
        loader = cls(FinalisedDataset("dataset", gone), batch_size=2,
                     collate_fn=FinalisedCollate("collate_fn", gone),
                     sampler=FinalisedSampler("sampler", gone),
                     worker_init_fn=FinalisedInit("worker_init_fn", gone), **workers)
        if iterated:
            for _batch in loader:
                pass
            del _batch
        del loader
        return gone

    _both(Loader, TorchLoader, script)


# found by a sweep: copy.copy made a pickling copy (no iterator), which started workers of its
# own where torch's copy runs the persistent workers it shares, with their copy of the dataset
def test_a_shallow_copy_runs_the_persistent_workers_it_shares(Loader, TorchLoader):
    def script(cls: type) -> list:
        ds = Arrays()
        loader = cls(ds, batch_size=16, num_workers=1, persistent_workers=True, timeout=60)
        first = [_plain(b) for b in loader]
        copied = copy.copy(loader)
        ds.x[:] = -1.0  # seen only by workers started after this
        return [first, [_plain(b) for b in copied], [_plain(b) for b in loader]]

    _both(Loader, TorchLoader, script)


# found by a sweep: stoker refused before drawing the base seed, so a program that caught the
# error drew other numbers afterwards
def test_a_timeout_without_workers_fails_as_torchs_after_torchs_draw(Loader, TorchLoader):
    def script(cls: type) -> list:
        torch.manual_seed(0)
        loader = cls(list(range(4)), batch_size=2, timeout=5)
        with pytest.raises(AssertionError) as raised:
            iter(loader)
        return [str(raised.value), torch.rand(2).tolist()]

    _both(Loader, TorchLoader, script)


# found by a sweep: torch calls iter() on the sampler a second time only once its workers run
# (its first _reset); stoker called it before starting them, so what a sampler's __iter__
# changes (a count, the length it asked of the dataset) reached the workers
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("batched", [False, True])
def test_workers_start_from_the_state_before_the_samplers_second_pass(
        Loader, TorchLoader, context, batched):
    def script(cls: type) -> list:
        np.random.seed(0)
        torch.manual_seed(0)
        sampler = CountingBatchSampler(4) if batched else CountingSampler(4)
        sampling: dict[str, Any] = ({"batch_sampler": sampler} if batched
                                    else {"batch_size": None, "sampler": sampler})
        loader = cls(ReadsSampler(sampler), num_workers=1, timeout=60,
                     multiprocessing_context=context, **sampling)
        return [_plain(b) for b in loader] + [sampler.passes]

    _both(Loader, TorchLoader, script)



def _as_is(batch: list) -> list:
    return batch


# found by a sweep: a worker that exited with code 0 (a Ctrl-C reached it) had sent a batch
# that stoker dropped, raising as it sent the next task; torch's loop hands it out and raises
# at the wait after it (NOTE [ A worker that exited with code 0 ])
def test_a_batch_sent_before_a_worker_exited_with_0_is_handed_out(Loader, TorchLoader):
    def script(cls: type) -> list:
        it = iter(cls(CtrlCAtThird(), num_workers=1, collate_fn=_as_is))
        got = [next(it)]  # the worker has batch 1 sent, sample 2 next
        for worker in multiprocessing.active_children():
            worker.join(120)  # gone (a hang guard, not a timing)
        assert not multiprocessing.active_children()
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            for _ in range(3):
                got.append(next(it))
        return got

    _both(Loader, TorchLoader, script)


# found by a sweep: stoker read a batch's indices before calling __getitems__ (a tuple of them,
# for stoker.sample_rng), so a batch sampler that yields one key per batch failed; the key is
# torch's to hand over as it is, in the main process and in a worker
@pytest.mark.parametrize("num_workers", [0, 1])
def test_getitems_gets_the_batch_samplers_own_key(Loader, TorchLoader, num_workers):
    def script(cls: type) -> list:
        keys = [1, 3, np.int64(2), (0, 1), torch.tensor(2)]
        if num_workers:  # a tensor key sent to a worker starts multiprocessing's resource
            keys.pop()   # sharer thread, for the process's life: a leak to the leak check
        loader = cls(BatchesByKey(), batch_sampler=keys, num_workers=num_workers,
                     timeout=60 if num_workers else 0, collate_fn=_as_is)
        return list(loader)

    _both(Loader, TorchLoader, script)


# found by a sweep: a batch sampler yielding ints for a plain dataset (a sampler passed as
# batch_sampler) killed stoker's worker as it split the batch into samples; torch's fetcher
# raises its TypeError, in the main process as in a worker
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("dataset", ["plain", "tensors"])
def test_a_batch_that_is_not_iterable_fails_as_under_torch(
        Loader, TorchLoader, num_workers, dataset):
    def script(cls: type) -> list:
        data = (list(range(8)) if dataset == "plain"
                else torch.utils.data.TensorDataset(torch.arange(8.0)))
        loader = cls(data, batch_sampler=[2, 3], num_workers=num_workers,
                     timeout=60 if num_workers else 0)
        with pytest.raises(TypeError) as raised:
            next(iter(loader))
        return [str(raised.value).splitlines()[-1].endswith("'int' object is not iterable")]

    _both(Loader, TorchLoader, script)


# found by a sweep: a spawned worker's first task was drawn before the next worker was pickled,
# so a __getstate__ that draws from the global RNG drew after RandomSampler's seed (another
# shuffle, other seeds); torch pickles every worker before the first draw
def test_a_dataset_that_draws_as_it_is_pickled_shuffles_as_under_torch(Loader, TorchLoader):
    def script(cls: type) -> list:
        torch.manual_seed(0)
        dataset = DrawsWhenPickled()
        loader = cls(dataset, batch_size=2, shuffle=True, num_workers=2, timeout=120,
                     multiprocessing_context="spawn", collate_fn=_as_is)
        return [list(loader), dataset.seed, torch.rand(1).item()]

    _both(Loader, TorchLoader, script)
