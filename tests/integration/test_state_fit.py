"""NOTE [ A state must fit its loader ]: a saved state loaded into a loader it does not fit,
or with fields of the wrong type, is refused with the field, the saved and the current value;
nothing resumes silently wrong."""

from __future__ import annotations

import warnings

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
    # Per-batch seeding's promise: under torch's per-worker seeding a state is refused at
    # another num_workers once a batch was delivered (NOTE [ Worker streams resume ]).
    state = _saved(seeding="per_batch")
    loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True, num_workers=2,
                               seeding="per_batch")
    loader.load_state_dict(state)
    assert len(list(loader)) == 7


def test_a_state_of_torchs_seeding_resumes_at_its_num_workers():
    state = _saved()
    loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True,
                               generator=torch.Generator().manual_seed(0))
    loader.load_state_dict(state)
    assert len(list(loader)) == 7
    with pytest.raises(ValueError, match=r"^load_state_dict: this state was saved with "
                                         r"num_workers=0 under torch's per-worker seeding"):
        stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True,
                          num_workers=2).load_state_dict(state)


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


# -- a state belongs to its rank (the context pinned, as stoker's workers pin it) --------------

_PER_RANK = "Save each rank's loader.state_dict() and load it on the same rank."


@pytest.fixture
def place():
    """``place(rank, world_size)`` pins this process's context until the test ends."""
    from stoker.distributed.context import DistContext, set_context

    yield lambda rank, world: set_context(DistContext(rank, world))
    set_context(None)


def _saved_on(place, rank: int, world: int, seed: int = 0) -> dict:
    place(rank, world)
    loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True,
                               generator=torch.Generator().manual_seed(seed))
    it = iter(loader)
    next(it)
    return loader.state_dict()


def test_a_state_records_its_rank_and_world_size(place):
    state = _saved_on(place, 1, 2)
    assert (state["rank"], state["world_size"]) == (1, 2)


def test_a_state_of_another_rank_of_the_same_world_size_is_warned_about(place):
    """Warned, not refused, where it has no part for this rank and no framework's advice
    applies: it is right when the ranks seeded alike; a run that succeeds must not fail."""
    state = _saved_on(place, 0, 2)
    place(1, 2)
    with pytest.warns(UserWarning) as told:
        _load(state)
    assert [str(w.message) for w in told] == [
        "load_state_dict: this state was saved by rank 0 of 2 and has no part for this "
        "process, rank 1. A loader's state belongs to the rank that saved it (the base seed and "
        "generator states it drew, its workers' and dataset's progress): loaded here, rank 1 "
        "would go on with rank 0's seeds, which is right only if every rank seeded its loader "
        "alike. " + _PER_RANK
    ]


def test_a_mix_of_two_ranks_states_is_refused(place):
    """What DCP gives a rank from a loader every rank saved under one key."""
    theirs, ours = _saved_on(place, 0, 2, seed=1), _saved_on(place, 1, 2, seed=2)
    assert theirs["base_seed"] != ours["base_seed"]
    with pytest.raises(ValueError) as info:
        _load({**ours, "base_seed": theirs["base_seed"]})
    assert str(info.value) == (
        "load_state_dict: this state is not the state of one rank: its fields do not match the "
        "digest rank 1 of 2 saved with them, so some come from another rank (or were edited). "
        "A loader's state belongs to the rank that saved it (the base seed and generator states "
        "it drew, its workers' and dataset's progress). " + _PER_RANK
    )


def test_a_state_loads_on_its_own_rank_at_any_world_size_and_without_a_rank(place):
    state = _saved_on(place, 2, 3)
    for rank, world in ((2, 3), (1, 2), (0, 1)):  # its own rank; elastic resumes
        place(rank, world)
        loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True)
        loader.load_state_dict(state)
        again = loader.state_dict()  # the pending state is now this rank's
        assert (again["rank"], again["world_size"]) == (rank, world)
        assert len(list(loader)) == 9
    older = {k: v for k, v in state.items() if k not in ("rank", "world_size", "digest")}
    place(0, 3)
    _load(older)  # saved before stoker recorded ranks


# -- NOTE [ Every rank's part ]: a framework's keys, and every rank's part in one state --------


def _rest(state: dict, rank: int, place) -> list[list[int]]:
    """The rest of the epoch on ``rank`` of 2 after loading ``state`` (a fresh loader with
    another generator: the state decides)."""
    place(rank, 2)
    loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True,
                               generator=torch.Generator().manual_seed(99))
    loader.load_state_dict(state)
    return [b.tolist() for b in loader]


def test_a_frameworks_keys_are_kept_out_of_the_digest_and_dropped(place):
    """Accelerate adds ``_iterator_finished`` to the state it saves: not a mix of ranks."""
    state = _saved_on(place, 1, 2, seed=1)
    expected = _rest(state, 1, place)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _rest({**state, "_iterator_finished": False}, 1, place) == expected
    loader = stoker.DataLoader(Numbers(100), batch_size=10, shuffle=True)
    loader.load_state_dict({**state, "_iterator_finished": False})
    assert "_iterator_finished" not in loader.state_dict()


def test_every_ranks_part_resumes_each_rank_with_its_own_state(place):
    """Rank 0's state with every rank's part (as stoker saves it under Lightning and
    Accelerate): each rank takes its own, silently, also from a mix of the ranks' copies (DCP)."""
    from stoker.engine.rank_state import with_ranks

    states = [_saved_on(place, r, 2, seed=10 + r) for r in (0, 1)]
    expected = [_rest(states[r], r, place) for r in (0, 1)]
    assert expected[0] != expected[1]  # seeded apart: another rank's state would show
    shared = with_ranks(states)
    assert shared is not None and shared["rank"] == 0
    assert sorted(shared["ranks"][1]) == ["base_seed", "digest", "rank", "rng"]  # only these
    mix = {**shared, "base_seed": states[1]["base_seed"]}  # DCP: a value from rank 1's copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rank in (0, 1):
            assert _rest(shared, rank, place) == expected[rank]
            assert _rest(mix, rank, place) == expected[rank]
    edited = {**shared, "ranks": [shared["ranks"][0], {**shared["ranks"][1], "base_seed": 5}]}
    with pytest.warns(UserWarning, match="has no part for this process, rank 1"):
        _rest(edited, 1, place)  # a part that does not match its digest is not used


_LIGHTNING = (
    "Lightning loads rank 0's checkpoint on every rank; stoker records every rank's part in it "
    "when Trainer.save_checkpoint runs on all ranks (as ModelCheckpoint does), and this "
    "checkpoint has none (saved another way, or by an older stoker). Save it with "
    "trainer.save_checkpoint on every rank, or call seed_everything(seed, workers=False) so "
    "that the ranks' loader states are alike."
)
_ACCELERATE = (
    "Accelerate's save_state writes one loader state for all ranks; stoker keeps each rank's "
    "own beside it (stoker_dl_state_dict_rank<r>.bin) where save_state() runs on that rank, "
    "and this rank has none (save_state() called on the main process alone, or by an older "
    "stoker). Call accelerator.save_state() on every process."
)


@pytest.mark.parametrize(("module", "advice"), [
    ("lightning.pytorch.loops.fit_loop", _LIGHTNING),
    ("accelerate.checkpointing", _ACCELERATE),
])
def test_the_advice_names_the_framework_that_loads_the_state(place, module, advice):
    """Loaded from a framework's code (its module on the stack), the advice is that
    framework's, not DCP's."""
    state = _saved_on(place, 0, 2)
    place(1, 2)
    namespace = {"__name__": module, "_load": _load}
    exec("def load(state):\n    _load(state)\n", namespace)  # a function of that module
    with pytest.warns(UserWarning) as told:
        namespace["load"](state)
    assert [str(w.message) for w in told] == [
        "load_state_dict: this state was saved by rank 0 of 2 and has no part for this "
        "process, rank 1. A loader's state belongs to the rank that saved it (the base seed and "
        "generator states it drew, its workers' and dataset's progress): loaded here, rank 1 "
        "would go on with rank 0's seeds, which is right only if every rank seeded its loader "
        "alike. " + advice
    ]
