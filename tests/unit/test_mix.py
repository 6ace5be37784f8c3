"""``stoker.mix.Mix``: validation messages, proportions, stop rules, determinism, state.

No processes: shards are simulated by building ``MixIterator`` with an explicit ``ShardInfo``
(tests/contract/test_mix.py runs the mix in real workers).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from stoker.distributed import ShardInfo
from stoker.mix import MapMix, Mix, MixIterator


class Tagged(Dataset):
    """Map-style source whose samples say where they come from: ``(name, index)``."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[str, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (self.name, int(i))


class Batched(Tagged):
    """Also has ``__getitems__``, and records how it was called."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name, n)
        self.calls: list[list[int]] = []

    def __getitems__(self, indices: list[int]) -> list[tuple[str, int]]:
        self.calls.append(list(indices))
        return [(self.name, -i) for i in indices]  # marked, to see which path served it


class TaggedStream(IterableDataset):
    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __iter__(self) -> Any:
        return ((self.name, i) for i in range(self.n))


def sources_of(samples: list[tuple[str, int]]) -> Counter:
    return Counter(name for name, _ in samples)


def shard(k: int, of: int) -> ShardInfo:
    return ShardInfo(rank=0, world_size=1, worker_id=k, num_workers=of)


# -- construction and validation ------------------------------------------------------------

def test_dispatches_on_the_kind_of_sources() -> None:
    mapped = Mix([Tagged("a", 3), [1, 2]])
    assert type(mapped).__name__ == "MapMix" and isinstance(mapped, Mix)
    assert not isinstance(mapped, IterableDataset)
    streamed = Mix([Tagged("a", 3), TaggedStream("b", 2)])
    assert type(streamed).__name__ == "IterableMix" and isinstance(streamed, Mix)
    assert isinstance(streamed, IterableDataset)


ERRORS = [
    (dict(datasets=[]), ValueError,
     "Mix needs at least one dataset, got an empty list: pass the datasets to sample from, "
     "e.g. Mix([ds_a, ds_b], weights=[0.7, 0.3])"),
    (dict(datasets=Tagged("a", 2)), TypeError,
     "Mix takes a list of datasets as its first argument, got <test_mix.Tagged object at "),
    (dict(datasets=[Tagged("a", 2), 5]), TypeError,
     "Mix source 1 is a int: expected a map-style dataset (with __len__ and __getitem__) or a "
     "torch.utils.data.IterableDataset"),
    (dict(datasets=[[1], [2], [3]], weights=[1, 2]), ValueError,
     "Mix got 3 datasets but 2 weights: give one weight per dataset, in the same order (or "
     "weights=None for equal weights)"),
    (dict(datasets=[[1], [2]], weights=[1, -0.5]), ValueError,
     "Mix weights[1]=-0.5: weights must be finite and >= 0 (they are relative sampling "
     "rates); use 0 to leave a dataset out"),
    (dict(datasets=[[1], [2]], weights=[float("nan"), 1]), ValueError,
     "Mix weights[0]=nan: weights must be finite and >= 0 (they are relative sampling "
     "rates); use 0 to leave a dataset out"),
    (dict(datasets=[[1], [2]], weights=["x", 1]), TypeError, "Mix weights[0]='x' is not a number"),
    (dict(datasets=[[1], [2]], weights=[0, 0.0]), ValueError,
     "Mix weights sum to 0 ([0.0, 0.0]): give at least one dataset a positive weight"),
    (dict(datasets=[[1], []], stop="cycle"), ValueError,
     "Mix source 1 (list) is empty but has weight 1: it can never yield a sample, and with "
     "stop='cycle' the mix would wait for it forever. Remove it, or give it weight 0"),
    (dict(datasets=[[1], Tagged("e", 0)], weights=[1, 0.25], stop="all_exhausted"), ValueError,
     "Mix source 1 (Tagged) is empty but has weight 0.25: it can never yield a sample, and "
     "with stop='all_exhausted' the mix would wait for it forever. Remove it, or give it "
     "weight 0"),
    (dict(datasets=[[1], []]), ValueError,
     "Mix source 1 (list) is empty but has weight 1: it can never yield a sample, and with "
     "stop='first_exhausted' the mix would end at its first draw. Remove it, or give it "
     "weight 0"),
    (dict(datasets=[[1]], stop="longest"), ValueError,
     "Mix stop='longest': expected one of ('first_exhausted', 'all_exhausted', 'cycle')"),
    (dict(datasets=[[1]], seed=-1), ValueError,
     "Mix seed=-1: expected an int >= 0 (it seeds numpy's SeedSequence)"),
    (dict(datasets=[[1]], num_samples=10), ValueError,
     "Mix num_samples=10 only applies to stop='cycle' (the other rules end the mix by "
     "themselves); drop num_samples or use stop='cycle'"),
    (dict(datasets=[[1]], stop="cycle", num_samples=-3), ValueError,
     "Mix num_samples=-3: expected an int >= 0"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), ERRORS)
def test_invalid_arguments_say_what_to_change(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        Mix(**kwargs)
    if message.endswith(" at "):  # the repr of an object holds its address
        assert str(raised.value).startswith(message)
        assert str(raised.value).endswith(
            ": pass them in a list, e.g. Mix([ds_a, ds_b], weights=[0.7, 0.3])"
        )
    else:
        assert str(raised.value) == message


def test_a_schedule_that_would_never_end_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        Mix([Tagged("a", 10), Tagged("b", 1000)], weights=[1, 1e-9], stop="all_exhausted")
    assert str(raised.value) == (
        "Mix with stop='all_exhausted' would need about 1e+12 draws: source 1 has 1000 samples "
        "but is drawn with probability 1e-09. Raise its weight, or use stop='first_exhausted' "
        "or stop='cycle' with num_samples"
    )


def test_an_empty_source_with_weight_zero_is_allowed() -> None:
    mix = Mix([Tagged("a", 4), []], weights=[1, 0], stop="cycle")
    assert sources_of([mix[i] for i in range(len(mix))]) == Counter({"a": 4})


# -- proportions ----------------------------------------------------------------------------

WEIGHTS = [0.7, 0.2, 0.1]


def within_binomial(counts: list[int], weights: list[float], sigmas: float = 5.0) -> bool:
    n, total = sum(counts), sum(weights)
    return all(
        abs(c - n * w / total) <= sigmas * math.sqrt(n * (w / total) * (1 - w / total))
        for c, w in zip(counts, weights, strict=True)
    )


def test_map_proportions_are_exact_for_a_seed_and_binomial() -> None:
    mix = Mix([Tagged("a", 10), Tagged("b", 20), Tagged("c", 30)], weights=WEIGHTS, seed=0,
              stop="cycle", num_samples=100_000)
    assert mix.counts().tolist() == [69920, 20069, 10011]
    assert within_binomial(mix.counts().tolist(), WEIGHTS)
    other = Mix([Tagged("a", 10), Tagged("b", 20), Tagged("c", 30)], weights=WEIGHTS, seed=1,
                stop="cycle", num_samples=100_000)
    assert other.counts().tolist() != mix.counts().tolist()
    assert within_binomial(other.counts().tolist(), WEIGHTS)


def test_iterable_proportions_are_binomial() -> None:
    mix = Mix([TaggedStream("a", 10), TaggedStream("b", 20), Tagged("c", 30)], weights=WEIGHTS,
              seed=0, stop="cycle", num_samples=100_000)
    counts = sources_of(list(mix))
    assert within_binomial([counts["a"], counts["b"], counts["c"]], WEIGHTS)


# -- stop rules -----------------------------------------------------------------------------

SIZES = {"a": 40, "b": 25, "c": 7}


def map_sources() -> list[Tagged]:
    return [Tagged(name, n) for name, n in SIZES.items()]


def stream_sources() -> list[Any]:
    return [TaggedStream("a", 40), Tagged("b", 25), TaggedStream("c", 7)]


def samples_of(mix: Any) -> list[tuple[str, int]]:
    if isinstance(mix, MapMix):
        return [mix[i] for i in range(len(mix))]
    return list(mix)


@pytest.mark.parametrize("make", [map_sources, stream_sources])
@pytest.mark.parametrize("seed", range(5))
def test_first_exhausted(make: Any, seed: int) -> None:
    samples = samples_of(Mix(make(), weights=[1, 2, 3], seed=seed))
    assert len(set(samples)) == len(samples), "every sample at most once"
    counts = sources_of(samples)
    assert all(counts[name] <= n for name, n in SIZES.items())
    # It ended at a draw that found a source exhausted: that one was read completely.
    assert any(counts[name] == n for name, n in SIZES.items())


@pytest.mark.parametrize("make", [map_sources, stream_sources])
@pytest.mark.parametrize("seed", range(5))
def test_all_exhausted(make: Any, seed: int) -> None:
    samples = samples_of(Mix(make(), weights=[1, 2, 3], seed=seed, stop="all_exhausted"))
    everything = {(name, i) for name, n in SIZES.items() for i in range(n)}
    assert set(samples) == everything, "every sample at least once"
    counts = sources_of(samples)
    # It ended at the draw that found the last source exhausted: that one appears exactly once
    # per sample, the others were oversampled (new rounds) while waiting.
    assert any(counts[name] == n for name, n in SIZES.items())
    assert max(counts[name] / n for name, n in SIZES.items()) > 1


@pytest.mark.parametrize("make", [map_sources, stream_sources])
def test_cycle_reads_whole_rounds(make: Any) -> None:
    samples = samples_of(Mix(make(), weights=[1, 1, 8], seed=3, stop="cycle", num_samples=300))
    assert len(samples) == 300
    firsts = [i for name, i in samples if name == "c"]
    assert len(firsts) > 3 * 7
    for r in range(3):  # each round of a source is a permutation of it
        assert sorted(firsts[7 * r : 7 * r + 7]) == list(range(7))


def test_map_cycle_length_defaults_to_the_sources_total() -> None:
    assert len(Mix(map_sources(), stop="cycle")) == sum(SIZES.values())
    assert len(Mix(map_sources(), weights=[1, 0, 1], stop="cycle")) == 40 + 7


def test_iterable_cycle_is_endless_without_num_samples() -> None:
    it = iter(Mix(stream_sources(), stop="cycle"))
    assert len([next(it) for _ in range(1000)]) == 1000


def test_weight_zero_sources_are_never_drawn_nor_awaited() -> None:
    for make in (map_sources, stream_sources):
        samples = samples_of(Mix(make(), weights=[1, 0, 1], stop="all_exhausted"))
        counts = sources_of(samples)
        assert counts["b"] == 0 and counts["a"] >= 40 and counts["c"] >= 7


def test_a_source_that_yields_nothing_in_a_pass_stops_a_cycling_mix() -> None:
    mix = Mix([TaggedStream("a", 3), TaggedStream("empty", 0)], stop="cycle")
    with pytest.raises(ValueError) as raised:
        list(mix)
    assert str(raised.value) == (
        "Mix source 1 (TaggedStream) yielded nothing in a whole pass (shard 0 of 1), so with "
        "stop='cycle' the mix cannot go on: give it weight 0, or give it at least as many "
        "samples as there are shards (ranks x workers)"
    )


# -- determinism, epochs, mapping -----------------------------------------------------------

def test_map_mix_is_a_deterministic_function_of_its_arguments() -> None:
    one, two = Mix(map_sources(), seed=4), Mix(map_sources(), seed=4)
    assert samples_of(one) == samples_of(two)
    assert samples_of(Mix(map_sources(), seed=5)) != samples_of(one)


def test_set_epoch_draws_a_new_schedule_reproducibly() -> None:
    mix = Mix(map_sources(), seed=4)
    first = samples_of(mix)
    mix.set_epoch(1)
    second = samples_of(mix)
    assert second != first
    other = Mix(map_sources(), seed=4)
    other.set_epoch(1)
    assert samples_of(other) == second
    mix.set_epoch(0)
    assert samples_of(mix) == first
    with pytest.raises(ValueError, match=r"^set_epoch\(-1\): expected an int >= 0$"):
        mix.set_epoch(-1)


def test_locate_getitem_and_getitems_agree() -> None:
    mix = Mix([Tagged("a", 9), Tagged("b", 5)], seed=2, stop="all_exhausted")
    for i in range(len(mix)):
        source, local = mix.locate(i)
        assert mix[i] == (["a", "b"][source], local)
    assert mix.__getitems__([3, 0, 3, len(mix) - 1]) == [mix[3], mix[0], mix[3], mix[-1]]
    with pytest.raises(IndexError, match=rf"^index {len(mix)} is out of range for a Mix of "):
        mix[len(mix)]


def test_getitems_forwards_per_source() -> None:
    batched = Batched("b", 6)
    mix = Mix([Tagged("a", 6), batched], seed=0, stop="all_exhausted")
    wanted = list(range(len(mix)))
    got = mix.__getitems__(wanted)
    assert len(batched.calls) == 1  # one call for the whole batch's share of that source
    for i, sample in zip(wanted, got, strict=True):
        source, local = mix.locate(i)
        assert sample == (("a", local) if source == 0 else ("b", -local))


def test_schedule_of_a_large_mix_is_vectorised() -> None:
    mix = Mix([range(2_000_000), range(500_000)], weights=[0.5, 0.5], stop="all_exhausted")
    counts = mix.counts()
    assert counts[0] == 2_000_000 and counts[1] >= 500_000
    assert mix.locate(len(mix) - 1)[0] == 0  # it ended when the big source ran out


# -- state ----------------------------------------------------------------------------------

def test_map_state_carries_the_epoch() -> None:
    mix = Mix(map_sources(), seed=4)
    mix.set_epoch(3)
    state = json.loads(json.dumps(mix.state_dict()))
    fresh = Mix(map_sources(), seed=4)
    fresh.load_state_dict(state)
    assert fresh.epoch == 3 and samples_of(fresh) == samples_of(mix)
    with pytest.raises(ValueError) as raised:
        Mix(map_sources(), seed=5).load_state_dict(state)
    assert str(raised.value) == (
        "cannot resume: the state was saved from a Mix with seed=4 but this one has seed=5; "
        "build the Mix with the same sources, weights, seed, stop and num_samples as the saved "
        "one"
    )
    with pytest.raises(ValueError, match=r"^cannot resume: the state was saved with source "):
        Mix([Tagged("a", 40), Tagged("b", 25), Tagged("c", 8)], seed=4).load_state_dict(state)


@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted", "cycle"])
def test_iterator_state_round_trip_at_every_step(stop: str) -> None:
    kwargs: dict[str, Any] = dict(weights=[1, 2, 3], seed=9, stop=stop)
    if stop == "cycle":
        kwargs["num_samples"] = 150
    full = list(Mix(stream_sources(), **kwargs))
    it = iter(Mix(stream_sources(), **kwargs))
    for k in range(len(full) + 1):
        state = json.loads(json.dumps(it.state_dict()))
        resumed = iter(Mix(stream_sources(), **kwargs))
        resumed.load_state_dict(state)
        assert full[:k] + list(resumed) == full, f"resumed after {k} samples"
        if k < len(full):
            assert next(it) == full[k]


def test_iterator_state_survives_torch_save() -> None:
    import io

    it = iter(Mix(stream_sources(), seed=1, stop="cycle", num_samples=3000))
    for _ in range(2500):  # past a few RNG blocks
        next(it)
    buffer = io.BytesIO()
    torch.save(it.state_dict(), buffer)
    buffer.seek(0)
    resumed = iter(Mix(stream_sources(), seed=1, stop="cycle", num_samples=3000))
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert list(resumed) == list(it)


def test_iterator_state_mismatch_errors() -> None:
    mix = Mix(stream_sources(), seed=1)
    state = iter(mix).state_dict()
    other = MixIterator(mix, shard(1, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError) as raised:
        other.load_state_dict(state)
    assert str(raised.value) == (
        "cannot resume: the state was saved in shard 0 of 1 but this iterator is shard 1 of 2; "
        "resume each shard with the same ranks and num_workers"
    )
    with pytest.raises(ValueError, match=r"^load_state_dict expects the dict returned by "):
        iter(mix).load_state_dict({"format": "something else"})
    it = iter(Mix([TaggedStream("a", 40), Tagged("b", 25), TaggedStream("c", 7)], seed=1))
    for _ in range(20):
        next(it)
    state = it.state_dict()
    shorter = iter(Mix([TaggedStream("a", 2), Tagged("b", 25), TaggedStream("c", 7)], seed=1))
    with pytest.raises(ValueError, match=r"^cannot resume: TaggedStream yielded 2 samples "):
        shorter.load_state_dict(state)


# -- shards ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted"])
def test_shards_read_disjoint_parts_of_each_round(stop: str) -> None:
    mix = Mix(stream_sources(), weights=[1, 1, 1], seed=0, stop=stop)
    outputs = [list(MixIterator(mix, shard(k, 3))) for k in range(3)]  # type: ignore[arg-type]
    assert outputs[0] != outputs[1]
    if stop == "first_exhausted":  # one round: no sample in two shards
        seen = [set(out) for out in outputs]
        assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    else:  # every sample is read in exactly one shard per round, so all of them appear
        union = set().union(*map(set, outputs))
        assert union == {(name, i) for name, n in SIZES.items() for i in range(n)}


def test_num_samples_is_split_across_shards() -> None:
    mix = Mix(stream_sources(), seed=0, stop="cycle", num_samples=100)
    lengths = [len(list(MixIterator(mix, shard(k, 3)))) for k in range(3)]  # type: ignore[arg-type]
    assert lengths == [34, 33, 33]


def test_unsharded_sources_are_read_whole_in_each_shard() -> None:
    mix = Mix([TaggedStream("a", 5)], shard_sources=False)
    assert list(MixIterator(mix, shard(1, 2))) == [("a", i) for i in range(5)]  # type: ignore[arg-type]


def test_pickles_by_reference_to_its_class() -> None:
    import pickle

    for mix in (Mix(map_sources(), seed=2), Mix(stream_sources(), seed=2)):
        again = pickle.loads(pickle.dumps(mix))
        assert type(again) is type(mix) and samples_of(again) == samples_of(mix)


def test_numpy_dtypes_of_the_mapping_are_plain_ints() -> None:
    mix = Mix([Tagged("a", 3), Tagged("b", 3)], stop="cycle")
    source, local = mix.locate(0)
    assert type(source) is int and type(local) is int
    assert np.all(mix.counts() >= 0)
