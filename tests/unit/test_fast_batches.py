"""``sampling.fast_batches`` against torch's own ``BatchSampler`` iteration: the same batches,
and the generator drawn at the same moments (its state compared after every batch)."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from stoker.sampling.fast_batches import fast_iter


def _pairs(make, steps):  # type: ignore[no-untyped-def]
    """(batch, generator state after it) from torch's iteration and from fast_iter's."""
    out = []
    for fast in (False, True):
        sampler, generator = make()
        it = fast_iter(sampler) if fast else iter(sampler)
        assert it is not None
        seen = []
        for batch in itertools.islice(it, steps):
            seen.append((batch, None if generator is None else generator.get_state()))
        seen.append(("end", None if generator is None else generator.get_state()))
        out.append(seen)
    return out


@pytest.mark.parametrize("n", [1, 7, 64, 100])
@pytest.mark.parametrize("batch_size", [1, 3, 32, 64, 150])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_samples", [None, 5, 130, 301])
def test_random_sampler_batches_and_draws_as_torch(n, batch_size, drop_last, num_samples):
    def make():  # type: ignore[no-untyped-def]
        generator = torch.Generator().manual_seed(n * 1000 + batch_size)
        inner = RandomSampler(range(n), num_samples=num_samples, generator=generator)
        return BatchSampler(inner, batch_size, drop_last), generator

    torch_run, fast_run = _pairs(make, 10_000)
    assert [b for b, _ in fast_run] == [b for b, _ in torch_run]
    for (_, want), (_, got) in zip(torch_run, fast_run, strict=True):
        assert torch.equal(want, got)  # drawn at the same moments


@pytest.mark.parametrize("steps", [0, 1, 2, 5])
def test_a_partly_read_epoch_has_drawn_what_torch_had(steps):
    def make():  # type: ignore[no-untyped-def]
        generator = torch.Generator().manual_seed(3)
        inner = RandomSampler(range(10), num_samples=35, generator=generator)
        return BatchSampler(inner, 4, False), generator

    torch_run, fast_run = _pairs(make, steps)
    assert [b for b, _ in fast_run] == [b for b, _ in torch_run]
    for (_, want), (_, got) in zip(torch_run, fast_run, strict=True):
        assert torch.equal(want, got)


def test_without_a_generator_the_seed_comes_from_the_global_rng_as_torch_draws_it():
    runs = []
    for fast in (False, True):
        torch.manual_seed(11)
        sampler = BatchSampler(RandomSampler(range(50)), 8, False)
        it = fast_iter(sampler) if fast else iter(sampler)
        assert it is not None
        runs.append((list(it), torch.rand(1).item()))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("n,batch_size,drop_last", [(0, 4, False), (10, 4, False),
                                                     (10, 4, True), (12, 4, False), (3, 8, True)])
def test_sequential_sampler_batches_as_torch(n, batch_size, drop_last):
    sampler = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
    fast = fast_iter(sampler)
    assert fast is not None
    assert list(fast) == list(sampler)


def test_batches_are_plain_lists_of_ints():
    generator = torch.Generator().manual_seed(0)
    sampler = BatchSampler(RandomSampler(range(20), generator=generator), 6, False)
    fast = fast_iter(sampler)
    assert fast is not None
    batches = list(fast)
    assert all(type(b) is list and all(type(i) is int for i in b) for b in batches)


def test_other_samplers_are_not_taken():
    class Mine(BatchSampler):
        pass

    assert fast_iter(Mine(SequentialSampler(range(4)), 2, False)) is None
    assert fast_iter(BatchSampler(RandomSampler(range(4), replacement=True), 2, False)) is None
    assert fast_iter(SequentialSampler(range(4))) is None


def _wrapped(fn):  # type: ignore[no-untyped-def]
    # the usual way to patch a method: functools.wraps copies its name, module and qualname
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        return fn(*args, **kwargs)
    return wrapper


@pytest.mark.parametrize(("cls", "name"), [
    (BatchSampler, "__iter__"), (BatchSampler, "__len__"), (RandomSampler, "__iter__"),
    (RandomSampler, "__len__"), (SequentialSampler, "__iter__"), (SequentialSampler, "__len__"),
])
def test_a_class_the_program_patched_is_not_taken(monkeypatch, cls, name):
    def sampler(inner_cls):  # type: ignore[no-untyped-def]
        return BatchSampler(inner_cls(range(10)), 3, False)

    inner = RandomSampler if cls is RandomSampler else SequentialSampler
    assert fast_iter(sampler(inner)) is not None
    monkeypatch.setattr(cls, name, _wrapped(getattr(cls, name)))
    assert fast_iter(sampler(inner)) is None


def test_a_patched_property_or_randperm_is_not_taken(monkeypatch):
    def sampler():  # type: ignore[no-untyped-def]
        return BatchSampler(RandomSampler(range(10)), 3, False)

    with monkeypatch.context() as patch:
        stock = RandomSampler.num_samples
        patch.setattr(RandomSampler, "num_samples", property(_wrapped(stock.fget)))
        assert fast_iter(sampler()) is None
    with monkeypatch.context() as patch:
        patch.setattr(torch, "randperm", _wrapped(torch.randperm))
        assert fast_iter(sampler()) is None
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "tolist", _wrapped(torch.Tensor.tolist), raising=False)
        assert fast_iter(sampler()) is None
    assert fast_iter(sampler()) is not None


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("at", [0, 1, 3, 6])
@pytest.mark.parametrize("new_size", [1, 4, 7, 40, 0])
def test_a_batch_size_changed_mid_epoch_is_read_as_torch_reads_it(drop_last, at, new_size):
    """torch's loop reads ``batch_size`` for every batch without drop_last (the new size from
    the next batch on; 0 ends the epoch), and once at the first batch with it (found by a
    sweep: the fast path kept the first size)."""
    runs = []
    for fast in (False, True):
        generator = torch.Generator().manual_seed(7)
        sampler = BatchSampler(RandomSampler(range(10), num_samples=23, generator=generator),
                               3, drop_last)
        it = fast_iter(sampler) if fast else iter(sampler)
        assert it is not None
        seen = []
        for step, batch in enumerate(it):
            seen.append((batch, generator.get_state().tolist()))
            if step == at:
                sampler.batch_size = new_size
        runs.append(seen)
    assert runs[1] == runs[0]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("size", [0, -1, 2.0])
def test_a_batch_size_the_constructor_would_refuse_set_before_the_first_batch(drop_last, size):
    """Set after the constructor checked it: torch's loop reads it as it is (0 ends the epoch
    at once, -1 raises from islice or zip, a float raises), and so does the fast path."""
    runs = []
    for fast in (False, True):
        sampler = BatchSampler(SequentialSampler(range(10)), 3, drop_last)
        it = fast_iter(sampler) if fast else iter(sampler)
        assert it is not None
        sampler.batch_size = size
        try:
            runs.append(("batches", list(itertools.islice(it, 20))))
        except Exception as exc:
            runs.append((type(exc).__name__, str(exc)))
    assert runs[1] == runs[0]
