"""The loader under test gives exactly what torch's DataLoader gives.

Each test builds torch's loader and the loader under test with the same arguments and a
``torch.Generator().manual_seed(SEED)`` each, runs both, and compares everything a user can
observe: construction errors, ``len(loader)``, every batch (types, containers, namedtuple
types, dtypes, shapes, values), the error an epoch ends with, and the warnings raised in the
main process.
"""

from __future__ import annotations

import itertools
import os
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from _datasets import (
    STRUCTURES,
    DuplicatingIterDS,
    GetItemsDS,
    IndexableRandomDS,
    LyingLenIterDS,
    MapDS,
    ShardedIterDS,
    SizedDuplicatingIterDS,
    SizedShardedIterDS,
    UnevenRandomDS,
    VariableBatchSampler,
    assert_batches_equal,
    collate_fn_for,
    drop_tracebacks,
    summarizing_collate,
)
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
)

SEED = 1234
N = 23  # batch sizes 1 and 7 leave a partial last batch (23 = 3 * 7 + 2)


@dataclass
class Outcome:
    """Everything a user can observe from building a loader and running some epochs."""

    ctor_error: type | None = None
    length: Any = None  # int, or the exception type len() raised
    epochs: list[list[Any]] = field(default_factory=list)
    epoch_error: type | None = None
    warnings: list[tuple[type, str]] = field(default_factory=list)


def run(
    loader_cls: type,
    dataset: Any,
    *,
    epochs: int = 1,
    len_first: bool = False,
    before_epoch: Callable[[int], None] | None = None,
    **kwargs: Any,
) -> Outcome:
    """Build ``loader_cls(dataset, generator=<seeded>, **kwargs)`` and run ``epochs`` epochs.

    ``len(loader)`` is taken after the epochs unless ``len_first`` (torch only warns about an
    IterableDataset yielding more than its length when len() was called before iterating).
    """
    out = Outcome()
    kwargs.setdefault("generator", torch.Generator().manual_seed(SEED))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            loader = loader_cls(dataset, **kwargs)
        except Exception as exc:
            out.ctor_error = type(exc)
            return out
        if len_first:
            out.length = _length(loader)
        try:
            for epoch in range(epochs):
                if before_epoch is not None:
                    before_epoch(epoch)
                batches: list[Any] = []
                out.epochs.append(batches)
                for batch in loader:
                    batches.append(batch)
        except Exception as exc:
            out.epoch_error = type(exc)
            drop_tracebacks(exc)
        if not len_first:
            out.length = _length(loader)
        del loader
    out.warnings = [(w.category, str(w.message)) for w in caught]
    return out


def _length(loader: Any) -> Any:
    try:
        return len(loader)
    except Exception as exc:
        return type(exc)


def assert_same(expected: Outcome, actual: Outcome) -> None:
    assert actual.ctor_error is expected.ctor_error, (
        f"constructor error: expected {expected.ctor_error}, got {actual.ctor_error}"
    )
    assert actual.length == expected.length, (
        f"len(loader): expected {expected.length}, got {actual.length}"
    )
    assert len(actual.epochs) == len(expected.epochs)
    for k, (exp, act) in enumerate(zip(expected.epochs, actual.epochs, strict=True)):
        assert len(act) == len(exp), f"epoch {k}: {len(act)} batches, torch gave {len(exp)}"
        assert_batches_equal(exp, act, f"epoch[{k}]")
    assert actual.epoch_error is expected.epoch_error, (
        f"error during the epochs: expected {expected.epoch_error}, got {actual.epoch_error}"
    )
    assert actual.warnings == expected.warnings, "warnings differ from torch's"


def compare(
    loader_cls: type, torch_cls: type, make_dataset: Callable[[], Any], **kw: Any
) -> Outcome:
    """Run torch and the loader under test on fresh datasets; assert they agree; torch's result."""
    expected = run(torch_cls, make_dataset(), **kw)
    actual = run(loader_cls, make_dataset(), **kw)
    assert_same(expected, actual)
    return expected


# --------------------------------------------------------------------------------------------
# The matrix: dataset kind x batch_size x shuffle x drop_last x num_workers x sample structure
# --------------------------------------------------------------------------------------------

DATASET_KINDS: dict[str, type] = {
    "map": MapDS,
    "iter_sharded": ShardedIterDS,
    "iter_dup": DuplicatingIterDS,
}


def _invalid(kind: str, batch_size: int | None, shuffle: bool, drop_last: bool) -> bool:
    return (batch_size is None and drop_last) or (kind != "map" and shuffle)


def _matrix() -> list[Any]:
    """The full product with num_workers=0. With num_workers=2 (each run starts workers, and CI
    has 2 cores) two slices that together cover every axis and every pair of axes that matters:
    every kind x structure (batch_size, shuffle, drop_last rotating through their values), and
    every kind x batch_size x shuffle x drop_last with the richest structure ("dict")."""
    seen: set[tuple] = set()
    params = []

    def add(kind: str, structure: str, bs: Any, shuffle: bool, drop_last: bool, nw: int) -> None:
        key = (kind, structure, bs, shuffle, drop_last, nw)
        if key in seen:
            return
        seen.add(key)
        name = f"{kind}-{structure}-bs{bs}-shuffle{int(shuffle)}-drop{int(drop_last)}-nw{nw}"
        params.append(pytest.param(*key, id=name))

    axes = (DATASET_KINDS, STRUCTURES, (None, 1, 7), (False, True), (False, True))
    for kind, structure, bs, shuffle, drop_last in itertools.product(*axes):
        add(kind, structure, bs, shuffle, drop_last, 0)
    valid_rest = [
        c
        for c in itertools.product((None, 1, 7), (False, True), (False, True))
        if not (c[0] is None and c[2])
    ]
    for k, (kind, structure) in enumerate(itertools.product(DATASET_KINDS, STRUCTURES)):
        bs, shuffle, drop_last = valid_rest[k % len(valid_rest)]
        add(kind, structure, bs, shuffle and kind == "map", drop_last, 2)
    for kind, (bs, shuffle, drop_last) in itertools.product(DATASET_KINDS, valid_rest):
        # shuffle=True on an iterable raises ValueError before any worker starts (checked once).
        add(kind, "dict", bs, shuffle, drop_last, 2)
    return params


@pytest.mark.parametrize("kind,structure,batch_size,shuffle,drop_last,num_workers", _matrix())
def test_matrix(Loader, TorchLoader, kind, structure, batch_size, shuffle, drop_last, num_workers):
    ds_cls = DATASET_KINDS[kind]
    expected = compare(
        Loader,
        TorchLoader,
        lambda: ds_cls(N, structure),
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        collate_fn=collate_fn_for(structure),
    )
    if kind != "map" and shuffle:
        assert expected.ctor_error is ValueError
    elif batch_size is None and drop_last:
        assert expected.ctor_error is ValueError
    else:
        assert expected.ctor_error is None and expected.epoch_error is None
        assert expected.epochs[0], "torch produced no batches: the case tests nothing"


# --------------------------------------------------------------------------------------------
# Samplers and batch samplers
# --------------------------------------------------------------------------------------------


def _g(seed: int = 99) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


SAMPLERS: dict[str, Callable[[Any], dict]] = {
    "sequential": lambda ds: {"sampler": SequentialSampler(ds)},
    "random": lambda ds: {"sampler": RandomSampler(ds, generator=_g())},
    "random_no_generator": lambda ds: {"sampler": RandomSampler(ds)},
    "random_replacement": lambda ds: {
        "sampler": RandomSampler(ds, replacement=True, num_samples=31, generator=_g())
    },
    "subset_random": lambda ds: {
        "sampler": SubsetRandomSampler([0, 2, 3, 5, 8, 13, 21], generator=_g())
    },
    "weighted": lambda ds: {
        "sampler": WeightedRandomSampler(
            [float(i % 4 + 1) for i in range(len(ds))], num_samples=30, generator=_g()
        )
    },
    "weighted_no_replacement": lambda ds: {
        "sampler": WeightedRandomSampler(
            [float(i + 1) for i in range(len(ds))], 11, replacement=False, generator=_g()
        )
    },
    "plain_list": lambda ds: {"sampler": [5, 3, 1, 22, 0]},
    "batch_sampler_custom": lambda ds: {"batch_sampler": VariableBatchSampler(len(ds))},
    "batch_sampler_random": lambda ds: {
        "batch_sampler": BatchSampler(RandomSampler(ds, generator=_g()), 5, drop_last=True)
    },
    "batch_sampler_list": lambda ds: {"batch_sampler": [[0, 1], [5], [2, 3, 4], [22, 21]]},
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("sampler_kind", list(SAMPLERS))
def test_samplers(Loader, TorchLoader, sampler_kind, num_workers):
    def one(loader_cls: type) -> Outcome:
        # torch.manual_seed: RandomSampler without a generator draws from the global RNG.
        torch.manual_seed(SEED)
        ds = MapDS(N, "dict")
        batch_kw = {} if sampler_kind.startswith("batch_sampler") else {"batch_size": 4}
        return run(
            loader_cls,
            ds,
            epochs=2,
            num_workers=num_workers,
            **batch_kw,
            **SAMPLERS[sampler_kind](ds),
        )

    expected = one(TorchLoader)
    actual = one(Loader)
    assert_same(expected, actual)
    assert expected.ctor_error is None and expected.epoch_error is None


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_distributed_sampler(Loader, TorchLoader, rank, drop_last, num_workers):
    def one(loader_cls: type) -> Outcome:
        ds = MapDS(N, "tensor")
        sampler = DistributedSampler(
            ds, num_replicas=2, rank=rank, shuffle=True, seed=7, drop_last=drop_last
        )
        return run(
            loader_cls,
            ds,
            epochs=2,
            batch_size=3,
            sampler=sampler,
            num_workers=num_workers,
            before_epoch=sampler.set_epoch,
        )

    expected = one(TorchLoader)
    assert_same(expected, one(Loader))
    assert len(expected.epochs[0]) == 4  # 12 (or 11 with drop_last) samples, batches of 3
    assert_not_equal(expected.epochs[0], expected.epochs[1])


def assert_not_equal(a: Any, b: Any) -> None:
    with pytest.raises(AssertionError):
        assert_batches_equal(a, b)


# --------------------------------------------------------------------------------------------
# Dataset types from torch.utils.data, and batched fetch
# --------------------------------------------------------------------------------------------

DATASETS: dict[str, Callable[[], Any]] = {
    "getitems": lambda: GetItemsDS(N, "dict"),
    "concat": lambda: ConcatDataset([MapDS(10, "namedtuple"), MapDS(13, "namedtuple")]),
    "subset": lambda: Subset(MapDS(N, "dict"), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]),
    "subset_of_getitems": lambda: Subset(GetItemsDS(N, "tensor"), [7, 0, 22, 11, 4]),
    "tensor_dataset": lambda: TensorDataset(
        torch.arange(2 * N, dtype=torch.float64).view(N, 2), torch.arange(N)
    ),
    "stack_dict": lambda: StackDataset(a=MapDS(N, "str"), b=MapDS(N, "numpy")),
    "stack_tuple": lambda: StackDataset(MapDS(N, "nested_list"), GetItemsDS(N, "tensor")),
    # Plain containers indexed by position: no class, no __dict__.
    "list": lambda: [float(i) for i in range(N)],
    "list_of_str": lambda: [f"path/{i}.jpg" for i in range(N)],
    "tuple": lambda: tuple((i, -i) for i in range(N)),
    "numpy": lambda: np.arange(3 * N, dtype=np.int16).reshape(N, 3),
    "dict_by_position": lambda: {i: {"x": i} for i in range(N)},
    "range": lambda: range(N),
    "tensor": lambda: torch.arange(N),
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
@pytest.mark.parametrize("dataset_kind", list(DATASETS))
def test_torch_datasets(Loader, TorchLoader, dataset_kind, batch_size, num_workers):
    expected = compare(
        Loader,
        TorchLoader,
        DATASETS[dataset_kind],
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
    )
    assert expected.ctor_error is None and expected.epoch_error is None


def test_getitems_is_used_for_batches(Loader):
    batches = list(Loader(GetItemsDS(N, "str"), batch_size=5))
    assert batches[0] == [("getitems",) * 5, tuple(f"sample-{i}" for i in range(5))]
    unbatched = list(Loader(GetItemsDS(N, "str"), batch_size=None))
    assert unbatched[0] == ["getitem", "sample-0"]  # default_convert turns tuples into lists


# --------------------------------------------------------------------------------------------
# collate_fn
# --------------------------------------------------------------------------------------------

COLLATES: dict[str, Any] = {
    "default_collate": default_collate,
    "summarizing": summarizing_collate,
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("collate", list(COLLATES))
def test_explicit_collate_fn(Loader, TorchLoader, collate, batch_size, num_workers):
    expected = compare(
        Loader,
        TorchLoader,
        lambda: MapDS(N, "dict"),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=COLLATES[collate],
    )
    # Without auto-batching collate_fn gets one sample (a dict), and ``batch[0]`` in both
    # collate functions raises KeyError: the same error from both loaders.
    assert expected.epoch_error is (KeyError if batch_size is None else None)


# --------------------------------------------------------------------------------------------
# len(loader), including iterables with __len__, and torch's warning when they yield more
# --------------------------------------------------------------------------------------------

LEN_DATASETS: dict[str, Callable[[], Any]] = {
    "sized_sharded": lambda: SizedShardedIterDS(N, "tensor"),
    "sized_dup": lambda: SizedDuplicatingIterDS(N, "tensor"),
    "unsized_iter": lambda: ShardedIterDS(N, "tensor"),
    "map": lambda: MapDS(N, "tensor"),
}


@pytest.mark.parametrize(
    "dataset_kind,batch_size,drop_last,num_workers",
    [
        c
        for c in itertools.product(LEN_DATASETS, (None, 1, 7), (False, True), (0, 2))
        if not (c[1] is None and c[2])  # invalid; covered by test_matrix
    ],
)
def test_len(Loader, TorchLoader, dataset_kind, batch_size, drop_last, num_workers):
    kw = dict(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
    # len() alone, without iterating (no worker starts).
    lengths = [_length(cls(LEN_DATASETS[dataset_kind](), **kw)) for cls in (TorchLoader, Loader)]
    assert lengths[1] == lengths[0]
    if dataset_kind == "unsized_iter":
        assert lengths[0] is TypeError
    # len() first, then an epoch: the same warnings when an iterable yields more than len().
    if num_workers == 0 or batch_size in (None, 1):  # keep the number of worker starts down
        ds = LEN_DATASETS[dataset_kind]()  # one object, so both warnings print the same repr
        expected = run(TorchLoader, ds, len_first=True, **kw)
        assert_same(expected, run(Loader, ds, len_first=True, **kw))


@pytest.mark.parametrize(
    "batch_size,num_workers", [(None, 0), (1, 0), (2, 0), (7, 0), (None, 2), (2, 2)]
)
def test_len_warning_when_iterable_yields_more(Loader, TorchLoader, batch_size, num_workers):
    ds = LyingLenIterDS(N, "tensor", reported=5)
    kw = dict(batch_size=batch_size, num_workers=num_workers)
    expected = run(TorchLoader, ds, len_first=True, **kw)
    assert_same(expected, run(Loader, ds, len_first=True, **kw))
    if batch_size in (None, 1, 2):
        assert expected.warnings, "torch warned here; the case must exercise the warning"
        assert all(cat is UserWarning for cat, _ in expected.warnings)


# --------------------------------------------------------------------------------------------
# Epochs: iterating the same loader again
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"]
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_two_epochs(Loader, TorchLoader, shuffle, num_workers, persistent):
    expected = compare(
        Loader,
        TorchLoader,
        lambda: MapDS(N, "tensor"),
        epochs=2,
        batch_size=5,
        shuffle=shuffle,
        num_workers=num_workers,
        persistent_workers=persistent,
    )
    first, second = expected.epochs
    if shuffle:
        assert_not_equal(first, second)
    else:
        assert_batches_equal(first, second)


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_two_epochs_iterable(Loader, TorchLoader, num_workers, persistent):
    compare(
        Loader,
        TorchLoader,
        lambda: ShardedIterDS(N, "dict"),
        epochs=2,
        batch_size=4,
        num_workers=num_workers,
        persistent_workers=persistent,
    )


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_iterable_out_of_order_gives_torchs_batches(Loader, TorchLoader, num_workers, persistent):
    # Shards of 8/8/7 or 12/11 elements: a worker's iterable ends while it holds tasks read
    # ahead and others still load; those tasks yield nothing and the epoch still ends.
    def sorted_epochs(loader_cls: type) -> list[list[Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 3 workers on a 2-core machine
            loader = loader_cls(ShardedIterDS(N, "tensor"), batch_size=2, num_workers=num_workers,
                                persistent_workers=persistent, in_order=False, timeout=60)
            return [sorted(b.tolist() for b in loader) for _ in range(2)]

    expected = sorted_epochs(TorchLoader)
    assert len(expected[0]) == 12
    assert sorted_epochs(Loader) == expected


def _shuffled_pipe() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(N)).shuffle(buffer_size=5).sharding_filter()


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (1, True), (2, False), (2, True)])
@pytest.mark.parametrize("seeded", [True, False], ids=["generator", "global_rng"])
def test_datapipe_graph_is_seeded_and_sharded_like_torch(
    Loader, TorchLoader, num_workers, persistent, seeded
):
    # The graph's shuffle seed is drawn per epoch from the generator (or torch's global RNG);
    # each worker shards the graph: every element once, in torch's order.
    def before_epoch(epoch: int) -> None:
        torch.manual_seed(SEED + epoch)

    expected = compare(
        Loader, TorchLoader, _shuffled_pipe, epochs=3, batch_size=4, shuffle=True,
        num_workers=num_workers, persistent_workers=persistent, before_epoch=before_epoch,
        **({} if seeded else {"generator": None}),
    )
    for epoch in expected.epochs:
        assert sorted(torch.cat(epoch).tolist()) == list(range(N))
    assert_not_equal(expected.epochs[0], expected.epochs[1])


def test_without_generator_uses_global_rng(Loader, TorchLoader):
    """generator=None: shuffling draws from torch's global RNG, like torch."""

    def one(loader_cls: type) -> Outcome:
        torch.manual_seed(SEED)
        return run(
            loader_cls, MapDS(N, "tensor"), epochs=2, batch_size=5, shuffle=True, generator=None
        )

    expected = one(TorchLoader)
    assert_same(expected, one(Loader))
    # And the global RNG is left where torch leaves it.
    torch.manual_seed(SEED)
    run(TorchLoader, MapDS(N, "tensor"), epochs=2, batch_size=5, shuffle=True, generator=None)
    after_torch = torch.rand(3)
    torch.manual_seed(SEED)
    run(Loader, MapDS(N, "tensor"), epochs=2, batch_size=5, shuffle=True, generator=None)
    assert torch.equal(torch.rand(3), after_torch)


def _seed_worker(worker_id: int) -> None:
    """The recipe in torch's reproducibility notes."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def _fixed_torch_seed(worker_id: int) -> None:  # torch's test_worker_init_fn
    torch.manual_seed(12345)


def _names_worker(worker_id: int) -> None:
    os.environ["STOKER_TEST_WORKER"] = str(worker_id)  # touches no RNG


class InitialSeedDS(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


_INIT_FN_SEEDED = "worker_init_fn seeded the global RNGs"


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("init_fn,dataset", [(_seed_worker, UnevenRandomDS),
                                             (_fixed_torch_seed, InitialSeedDS)])
def test_seeds_set_in_worker_init_fn_stay(Loader, TorchLoader, init_fn, dataset, persistent):
    """A worker_init_fn that seeds the global RNGs gets torch's per-worker streams under
    seeding="per_batch" too (NOTE [ Seeds set in worker_init_fn stay ]), and is told so once."""
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": 2, "epochs": 2,
              "persistent_workers": persistent, "worker_init_fn": init_fn}
    expected = run(TorchLoader, dataset(), **kwargs)
    options = {"seeding": "per_batch"} if Loader is not TorchLoader else {}
    actual = run(Loader, dataset(), **kwargs, **options)
    told = [w for w in actual.warnings if _INIT_FN_SEEDED in w[1]]
    if Loader is not TorchLoader:
        assert len(told) == 1, actual.warnings
    actual.warnings = [w for w in actual.warnings if w not in told]
    assert_same(expected, actual)


def test_worker_init_fn_without_seeding_keeps_per_batch_seeds(Loader, stoker_only):
    kwargs = {"batch_size": 4, "shuffle": True, "epochs": 1, "seeding": "per_batch"}
    alone = run(Loader, UnevenRandomDS(40), num_workers=0, **kwargs)
    with_init = run(Loader, UnevenRandomDS(40), num_workers=2, worker_init_fn=_names_worker,
                    **kwargs)
    assert not with_init.warnings
    assert_same(alone, with_init)  # the same draws as without workers


@pytest.mark.parametrize("dataset", [UnevenRandomDS, IndexableRandomDS])
def test_per_worker_seeding_gives_torchs_augmentations(Loader, TorchLoader, dataset):
    """seeding="per_worker" is torch's seeding: each worker's RNG stream is its own, so a batch
    must go to the worker torch gives it (round-robin), whatever the workers' speeds, and
    nothing stoker does on the side (a probe of a batched call) may draw from it."""
    kwargs = {"batch_size": 8, "shuffle": True, "num_workers": 2}
    expected = run(TorchLoader, dataset(), **kwargs)
    options = {"seeding": "per_worker"} if Loader is not TorchLoader else {}
    assert_same(expected, run(Loader, dataset(), **kwargs, **options))
