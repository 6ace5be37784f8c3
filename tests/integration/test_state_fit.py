"""NOTE [ A state must fit its loader ]: a saved state loaded into a loader it does not fit,
or with fields of the wrong type, is refused with the field, the saved and the current value;
nothing resumes silently wrong."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

import stoker

_ADVICE = (
    "Its batch positions would name other samples (some repeated, some never seen). Build the "
    "loader as it was when the state was saved, or start the epoch without loading the state."
)
_UNCHANGED = "Pass the dict returned by DataLoader.state_dict() unchanged."


class Numbers(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _saved(n: int = 100, **kwargs) -> dict:
    loader = stoker.DataLoader(Numbers(n), batch_size=10, shuffle=True,
                               generator=torch.Generator().manual_seed(0), **kwargs)
    it = iter(loader)
    for _ in range(3):
        next(it)
    return loader.state_dict()


def _load(state: dict, n: int = 100, **kwargs) -> None:
    kw = {"batch_size": 10, "shuffle": True, **kwargs}
    stoker.DataLoader(Numbers(n), **kw).load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "field", "saved", "now"),
    [
        ({"n": 120}, "len(dataset)", 100, 120),
        ({"batch_size": 20}, "batch_size", 10, 20),
        ({"drop_last": True}, "drop_last", False, True),
        ({"shuffle": False},
         "the sampler (shuffle=True draws a RandomSampler, False a SequentialSampler)",
         "torch.utils.data.sampler.RandomSampler", "torch.utils.data.sampler.SequentialSampler"),
    ],
)
def test_a_state_that_does_not_fit_says_which_field(change, field, saved, now):
    state = _saved()
    with pytest.raises(ValueError) as info:
        _load(state, **change)
    assert str(info.value) == (
        f"load_state_dict: this state does not fit the loader: {field} was {saved!r} when it "
        f"was saved and is {now!r} now. " + _ADVICE
    )


def test_a_state_that_fits_resumes_across_num_workers():
    state = _saved()
    loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True, num_workers=2)
    loader.load_state_dict(state)
    assert len(list(loader)) == 7


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("base_seed", b"\x01", "an int seed"),
        ("batches", "3", "a count of batches delivered (int >= 0)"),
        ("batches", -1, "a count of batches delivered (int >= 0)"),
        ("finished", 1, "a bool"),
        ("epoch", 1.5, "an epoch number (int >= 0)"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(field, value, expected):
    state = _saved()
    state[field] = value
    with pytest.raises(ValueError) as info:
        _load(state)
    assert str(info.value) == (
        f"load_state_dict: state[{field!r}] is {value!r} ({type(value).__name__}), expected "
        f"{expected}. " + _UNCHANGED
    )


def test_tampered_counts_are_refused():
    state = _saved()
    state["batches"] = 11
    with pytest.raises(ValueError) as info:
        _load(state)
    assert str(info.value) == (
        "load_state_dict: state['batches'] says batches=11 were delivered, but an epoch of this "
        "loader has 10 batches (len(loader)). " + _UNCHANGED
    )
    state = _saved()
    state["extra_batches"] = [4, "x"]
    with pytest.raises(ValueError) as info:
        _load(state)
    assert str(info.value) == (
        "load_state_dict: state['extra_batches'] is [4, 'x'], expected a list of batch "
        "positions (ints >= 0). " + _UNCHANGED
    )
