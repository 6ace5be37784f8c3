"""The constructor is torch's: same signature and defaults, same validation errors and warnings,
same attributes after construction, frozen attributes, generic alias, and a torch DataLoader
as far as ``isinstance`` is concerned.
"""

from __future__ import annotations

import inspect
import multiprocessing
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _datasets import MapDS, ShardedIterDS, VariableBatchSampler
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
)


class _NoLen(torch.utils.data.Dataset):
    def __getitem__(self, i: int) -> int:
        return i


def _ds() -> MapDS:
    return MapDS(10, "tensor")


# Each entry: () -> (dataset, kwargs). The same objects go to both loaders, so messages that
# print a sampler's repr agree.
BAD_ARGUMENTS: dict[str, Callable[[], tuple[Any, dict]]] = {
    "num_workers_negative": lambda: (_ds(), dict(num_workers=-1)),
    "num_workers_str": lambda: (_ds(), dict(num_workers="2")),
    "timeout_negative": lambda: (_ds(), dict(timeout=-1)),
    "timeout_str": lambda: (_ds(), dict(timeout="1")),
    "prefetch_without_workers": lambda: (_ds(), dict(prefetch_factor=2)),
    "prefetch_negative": lambda: (_ds(), dict(num_workers=2, prefetch_factor=-1)),
    "persistent_without_workers": lambda: (_ds(), dict(persistent_workers=True)),
    "iterable_shuffle_true": lambda: (ShardedIterDS(), dict(shuffle=True)),
    "iterable_shuffle_truthy": lambda: (ShardedIterDS(), dict(shuffle=1)),
    "iterable_sampler": lambda: (ShardedIterDS(), dict(sampler=[0, 1, 2])),
    "iterable_batch_sampler": lambda: (ShardedIterDS(), dict(batch_sampler=[[0, 1]])),
    "sampler_and_shuffle": lambda: (
        (ds := _ds()),
        dict(sampler=SequentialSampler(ds), shuffle=True),
    ),
    "batch_sampler_and_batch_size": lambda: (
        _ds(),
        dict(batch_sampler=VariableBatchSampler(10), batch_size=2),
    ),
    "batch_sampler_and_batch_size_none": lambda: (
        _ds(),
        dict(batch_sampler=VariableBatchSampler(10), batch_size=None),
    ),
    "batch_sampler_and_shuffle": lambda: (
        _ds(),
        dict(batch_sampler=VariableBatchSampler(10), shuffle=True),
    ),
    "batch_sampler_and_sampler": lambda: (
        (ds := _ds()),
        dict(batch_sampler=VariableBatchSampler(10), sampler=SequentialSampler(ds)),
    ),
    "batch_sampler_and_drop_last": lambda: (
        _ds(),
        dict(batch_sampler=VariableBatchSampler(10), drop_last=True),
    ),
    "batch_size_none_and_drop_last": lambda: (_ds(), dict(batch_size=None, drop_last=True)),
    "batch_size_zero": lambda: (_ds(), dict(batch_size=0)),
    "batch_size_negative": lambda: (_ds(), dict(batch_size=-3)),
    "batch_size_float": lambda: (_ds(), dict(batch_size=2.0)),
    "batch_size_bool": lambda: (_ds(), dict(batch_size=True)),
    "drop_last_str": lambda: (_ds(), dict(drop_last="yes")),
    "shuffle_without_len": lambda: (_NoLen(), dict(shuffle=True)),
    "context_unknown_name": lambda: (_ds(), dict(num_workers=2, multiprocessing_context="nope")),
    "context_wrong_type": lambda: (_ds(), dict(num_workers=2, multiprocessing_context=42)),
    "context_without_workers": lambda: (_ds(), dict(multiprocessing_context="fork")),
    "context_object_without_workers": lambda: (
        _ds(),
        dict(multiprocessing_context=multiprocessing.get_context("spawn")),
    ),
}


def _ctor_error(loader_cls: type, dataset: Any, kwargs: dict) -> tuple[type, str] | None:
    try:
        loader_cls(dataset, **kwargs)
    except Exception as exc:
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_raise_like_torch(Loader, TorchLoader, case):
    dataset, kwargs = BAD_ARGUMENTS[case]()
    expected = _ctor_error(TorchLoader, dataset, kwargs)
    assert expected is not None, "torch accepts this: the table entry is wrong"
    actual = _ctor_error(Loader, dataset, kwargs)
    assert actual is not None, f"accepted {kwargs}; torch raises {expected[0].__name__}"
    assert actual[0] is expected[0], f"{actual[0].__name__}: {actual[1]}"
    assert actual[1] == expected[1]


GOOD_ARGUMENTS: dict[str, Callable[[], tuple[Any, dict]]] = {
    "defaults": lambda: (_ds(), {}),
    "shuffle": lambda: (_ds(), dict(shuffle=True)),
    "shuffle_truthy": lambda: (_ds(), dict(shuffle="yes")),
    "shuffle_false_iterable": lambda: (ShardedIterDS(), dict(shuffle=False)),
    "batch_size_none": lambda: (_ds(), dict(batch_size=None)),
    "batch_sampler": lambda: (_ds(), dict(batch_sampler=VariableBatchSampler(10))),
    "workers": lambda: (_ds(), dict(num_workers=2)),
    "workers_all": lambda: (
        _ds(),
        dict(
            num_workers=2,
            prefetch_factor=3,
            persistent_workers=True,
            timeout=5,
            in_order=False,
            pin_memory=True,
            multiprocessing_context="spawn",
        ),
    ),
    "prefetch_zero": lambda: (_ds(), dict(num_workers=2, prefetch_factor=0)),
    "no_len_sequential": lambda: (_NoLen(), {}),
}

ATTRIBUTES = [
    "batch_size",
    "drop_last",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "pin_memory_device",
    "timeout",
    "worker_init_fn",
    "persistent_workers",
    "in_order",
    "generator",
]


@pytest.mark.parametrize("case", list(GOOD_ARGUMENTS))
def test_attributes_after_construction_match_torch(Loader, TorchLoader, case):
    dataset, kwargs = GOOD_ARGUMENTS[case]()
    with warnings.catch_warnings(record=True) as caught_torch:
        warnings.simplefilter("always")
        expected = TorchLoader(dataset, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = Loader(dataset, **kwargs)
    assert [(w.category, str(w.message)) for w in caught] == [
        (w.category, str(w.message)) for w in caught_torch
    ]
    for name in ATTRIBUTES:
        assert getattr(actual, name) == getattr(expected, name), name
    assert actual.dataset is dataset
    assert type(actual.sampler) is type(expected.sampler)
    assert type(actual.batch_sampler) is type(expected.batch_sampler)
    assert actual.collate_fn is expected.collate_fn
    assert actual._auto_collation == expected._auto_collation
    assert actual._dataset_kind == expected._dataset_kind
    if isinstance(expected.batch_sampler, BatchSampler):
        assert actual.batch_sampler.batch_size == expected.batch_sampler.batch_size
        assert actual.batch_sampler.drop_last == expected.batch_sampler.drop_last
        assert type(actual.batch_sampler.sampler) is type(expected.batch_sampler.sampler)
    ctx_actual, ctx_expected = actual.multiprocessing_context, expected.multiprocessing_context
    assert type(ctx_actual) is type(ctx_expected)
    if ctx_expected is not None:
        assert ctx_actual.get_start_method() == ctx_expected.get_start_method()


def test_default_samplers_and_collate(Loader):
    ds = _ds()
    assert isinstance(Loader(ds).sampler, SequentialSampler)
    assert isinstance(Loader(ds, shuffle=True).sampler, RandomSampler)
    g = torch.Generator()
    assert Loader(ds, shuffle=True, generator=g).sampler.generator is g
    assert Loader(ds).collate_fn is default_collate
    assert Loader(ds, batch_size=None).collate_fn is default_convert
    assert Loader(ds, num_workers=2).prefetch_factor == 2
    assert Loader(ds).prefetch_factor is None


def test_too_many_workers_warns_like_torch(Loader, TorchLoader):
    too_many = (torch._utils.cpu_count() or 1) + 1

    def warned(loader_cls: type) -> list[tuple[type, str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader_cls(_ds(), num_workers=too_many)
        return [(w.category, str(w.message)) for w in caught]

    expected = warned(TorchLoader)
    assert expected, "torch warns here"
    assert warned(Loader) == expected


@pytest.mark.parametrize(
    "attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_frozen_attributes(Loader, TorchLoader, attr):
    def set_error(loader_cls: type) -> tuple[type, str]:
        loader = loader_cls(_ds(), batch_size=2)
        with pytest.raises(ValueError) as info:
            setattr(loader, attr, getattr(loader, attr))
        return type(info.value), str(info.value)

    assert set_error(Loader) == set_error(TorchLoader)
    assert (
        set_error(Loader)[1]
        == f"{attr} attribute should not be set after DataLoader is initialized"
    )


def test_unfrozen_attributes_can_be_set(Loader):
    loader = Loader(_ds(), batch_size=2)
    loader.num_workers = 0
    loader.collate_fn = default_collate
    loader.timeout = 0
    assert len(list(loader)) == 5


def test_signature_and_defaults_match_torch(Loader, TorchLoader):
    expected = inspect.signature(TorchLoader.__init__).parameters
    actual = inspect.signature(Loader.__init__).parameters
    names = list(actual)
    assert names[: len(expected)] == list(expected), "torch's parameters, in torch's order"
    for name, param in expected.items():
        assert actual[name].kind == param.kind, name
        assert actual[name].default == param.default, name
    for name in names[len(expected) :]:
        extra = actual[name]
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY, f"extra parameter {name}"
        assert extra.default is not inspect.Parameter.empty, f"extra parameter {name}"


def test_positional_arguments_like_torch(Loader, TorchLoader):
    g = torch.Generator().manual_seed(5)
    args = (_ds(), 3, True, None, None, 0, None, False, True, 0, None, None)
    batches = list(Loader(*args, g))
    expected = list(TorchLoader(*args, torch.Generator().manual_seed(5)))
    assert [b.tolist() for b in batches] == [b.tolist() for b in expected]


def test_generic_alias_at_runtime(Loader):
    alias = Loader[int]
    loader = alias(_ds(), batch_size=5)
    assert isinstance(loader, Loader)
    assert len(list(loader)) == 2


def test_is_a_torch_dataloader(Loader):
    loader = Loader(_ds())
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert issubclass(Loader, torch.utils.data.DataLoader)


def test_loader_under_test_is_the_one_asked_for(Loader, loader_name):
    expected_module = "torch.utils.data" if loader_name == "torch" else "stoker"
    assert Loader.__module__.startswith(expected_module)


def _iter_error(loader: Any) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        iter(loader)
    return type(info.value), str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [dict(generator=0), dict(generator=0, shuffle=True), dict(generator="seed", batch_size=None),
     dict(generator=0, num_workers=2, persistent_workers=True)],
    ids=["int", "int_shuffle", "str_no_batching", "int_persistent_workers"],
)
def test_a_generator_that_is_not_a_generator_raises_at_iter_like_torch(
        Loader, TorchLoader, kwargs):
    """torch accepts any ``generator=`` at construction and raises ``random_()``'s TypeError,
    which names ``generator=int``, at ``iter()`` (drawing the base seed). (torch's reference
    runs without workers: its half-made worker iterator fails again in ``__del__``.)"""
    in_torch = {k: v for k, v in kwargs.items() if k not in ("num_workers", "persistent_workers")}
    expected = _iter_error(TorchLoader(_ds(), **in_torch))
    assert expected[0] is TypeError
    assert expected[1].startswith(
        "random_() received an invalid combination of arguments - got (generator="
        f"{type(kwargs['generator']).__name__}, ), but expected one of:")
    assert _iter_error(Loader(_ds(), **kwargs)) == expected
