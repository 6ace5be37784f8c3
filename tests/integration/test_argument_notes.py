"""NOTE [ torch's errors, with a note ]: where torch's check of an argument fails with a text
that names neither the argument nor the fix, stoker raises the same error (type and text, as
torch 2.13 raises it for the same program) with a note that does."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

import stoker


class Numbers(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i


def _error(make: Any, cls: type, **kwargs: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        make(cls, **kwargs)
    return info.value


def _construct(cls: type, **kwargs: Any) -> Any:
    return cls(Numbers(), **kwargs)


def _iterate(cls: type, **kwargs: Any) -> Any:
    return iter(cls(Numbers(), **kwargs))


def _same_as_torch(make: Any, **kwargs: Any) -> list[str]:
    """stoker's error for ``make(loader class, **kwargs)``: torch's type and text; its notes."""
    theirs = _error(make, torch.utils.data.DataLoader, **kwargs)
    ours = _error(make, stoker.DataLoader, **kwargs)
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)
    assert not hasattr(theirs, "__notes__")
    return getattr(ours, "__notes__", [])


@pytest.mark.parametrize(("value", "seed"), [(0, "0"), ("seed", "seed")])
def test_a_generator_that_is_not_one_is_named_with_the_fix(value, seed):
    notes = _same_as_torch(_iterate, generator=value)
    assert notes == [
        f"stoker: generator={value!r} ({type(value).__name__}) is not a torch.Generator: the "
        "loader draws its shuffle order and its workers' base seed from it. Pass "
        f"generator=torch.Generator().manual_seed({seed}) for a seeded run, or leave "
        "generator=None."
    ]


# torch's half-made worker iterator fails again in its __del__ (an unraisable AttributeError)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_prefetch_factor_zero_is_named_with_the_fix():
    notes = _same_as_torch(_iterate, num_workers=2, prefetch_factor=0)
    assert notes == [
        "stoker: prefetch_factor=0: with num_workers > 0 each worker keeps prefetch_factor "
        "batches loading ahead of the loop, so it must be 1 or more; leave it None for torch's "
        "default of 2."
    ]


def test_a_misspelt_keyword_gets_did_you_mean():
    assert _same_as_torch(_construct, num_worker=2) == [
        "stoker: DataLoader takes no argument 'num_worker': did you mean num_workers?"]
    assert _same_as_torch(_construct, batchsize=2, shufle=True) == [
        "stoker: DataLoader takes no argument 'batchsize': did you mean batch_size?",
        "stoker: DataLoader takes no argument 'shufle': did you mean shuffle?",
    ]


def test_a_keyword_like_no_argument_lists_them():
    names = list(inspect.signature(stoker.DataLoader.__init__).parameters)[1:]
    assert names[:3] == ["dataset", "batch_size", "shuffle"]
    assert _same_as_torch(_construct, colour="red") == [
        "stoker: DataLoader takes no argument 'colour'; its arguments are "
        f"{', '.join(names)} (help(stoker.DataLoader) describes each)."]


def test_a_subclass_is_named_and_errors_raised_inside_get_no_note():
    with pytest.raises(TypeError) as info:
        stoker.StatefulDataLoader(Numbers(), num_worker=2)
    assert str(info.value) == (
        "DataLoader.__init__() got an unexpected keyword argument 'num_worker'")
    assert info.value.__notes__ == [
        "stoker: StatefulDataLoader takes no argument 'num_worker': did you mean num_workers?"]
    notes = _same_as_torch(_construct, num_workers="2")  # raised inside torch's constructor
    assert notes == []
