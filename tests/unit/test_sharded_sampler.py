"""ShardedSampler (torch equality, coverage, equal step counts, elastic resume math), the epoch
autopilot, EndOfData padding, rank detection and the iterable shard helpers. No processes:
ranks are simulated by building one sampler per rank (tests/integration/test_distributed.py
runs real process groups)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, Dataset, DistributedSampler, SequentialSampler
from torch.utils.data._utils import worker as torch_worker

from stoker.distributed import (
    DistContext,
    EndOfData,
    ShardInfo,
    auto_set_epoch,
    begin_epoch,
    detect,
    even_batches,
    set_context,
    shard_info,
    shard_iterable,
    shard_list,
)
from stoker.sampling.sharded import Even, ShardedSampler

POLICIES: tuple[Even, ...] = ("pad", "drop", "exact")


class Ints(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def make(n: int, world: int, even: Even = "exact", seed: int = 3) -> list[ShardedSampler]:
    return [
        ShardedSampler(n, rank=r, world_size=world, shuffle=True, seed=seed, even=even)
        for r in range(world)
    ]


def global_order(n: int, seed: int, epoch: int = 0) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


# -- equality with torch's DistributedSampler ------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3, 7, 10, 16, 23])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_pad_and_drop_yield_exactly_what_distributed_sampler_yields(
    n: int, world: int, shuffle: bool, drop_last: bool
) -> None:
    data = Ints(n)
    for rank in range(world):
        ours = ShardedSampler(
            n, rank=rank, world_size=world, shuffle=shuffle, seed=11, drop_last=drop_last
        )
        theirs: DistributedSampler[int] = DistributedSampler(
            data, num_replicas=world, rank=rank, shuffle=shuffle, seed=11, drop_last=drop_last
        )
        assert ours.even == ("drop" if drop_last else "pad")
        for epoch in range(3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


def test_even_spelling_matches_drop_last_spelling() -> None:
    for rank in range(3):
        a = ShardedSampler(10, rank=rank, world_size=3, even="drop")
        b = ShardedSampler(10, rank=rank, world_size=3, drop_last=True)
        assert list(a) == list(b) and a.drop_last and b.drop_last


# -- coverage and equal step counts ------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 5, 10, 23, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_exact_reads_every_index_once_and_ranks_take_equal_steps(n: int, world: int) -> None:
    samplers = make(n, world)
    shares = [list(s) for s in samplers]
    flat = [i for share in shares for i in share]
    assert sorted(flat) == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert [len(s) for s in samplers] == list(map(len, shares))
    for batch_size in (1, 2, 3, 8):
        for drop_last in (False, True):
            counts = {s.num_batches(batch_size, drop_last) for s in samplers}
            assert len(counts) == 1, "ranks disagree on the step count"
            (steps,) = counts
            for s in samplers:
                short = steps - s.local_num_batches(batch_size, drop_last)
                assert short in (0, 1)


@pytest.mark.parametrize("even", ["pad", "drop"])
def test_pad_and_drop_give_equal_shares(even: Even) -> None:
    samplers = make(23, 4, even=even)
    assert len({len(list(s)) for s in samplers}) == 1
    flat = Counter(i for s in samplers for i in s)
    if even == "pad":
        assert set(flat) == set(range(23)) and sum(flat.values()) == 24  # one padding repeat
    else:
        assert sum(flat.values()) == 20 and max(flat.values()) == 1


def test_even_batches_pads_short_ranks_with_end_of_data() -> None:
    n, world, bs = 10, 4, 2  # shares 3, 3, 2, 2 -> batches 2, 2, 1, 1
    samplers = make(n, world)
    streams = []
    for s in samplers:
        batches = list(BatchSampler(s, bs, drop_last=False))
        streams.append(list(even_batches(batches, s.num_batches(bs), rank=s.rank)))
    assert [len(x) for x in streams] == [2, 2, 2, 2]
    assert streams[3][1] == EndOfData(rank=3, step=1, num_batches=2)
    assert not isinstance(streams[0][1], EndOfData)
    marker = streams[2][1]
    assert isinstance(marker, EndOfData) and not marker and len(marker) == 0
    real = [i for stream in streams for b in stream if not isinstance(b, EndOfData) for i in b]
    assert sorted(real) == list(range(n))


def test_even_batches_refuses_more_batches_than_agreed() -> None:
    with pytest.raises(RuntimeError) as info:
        list(even_batches([[0], [1], [2]], 2, rank=1))
    assert str(info.value) == (
        "rank 1 has more than num_batches=2 batches this epoch; every rank must agree on "
        "num_batches (take it from sampler.num_batches())"
    )


# -- resume ----------------------------------------------------------------------------------


@dataclass
class Resumed:
    order: list[int]
    consumed: int
    before: list[int] = field(default_factory=list)  # what the old ranks read, all ranks
    after: list[list[int]] = field(default_factory=list)  # per new rank


def run_and_resume(
    n: int, w_old: int, w_new: int, bs: int, steps: int, even: Even, seed: int = 5
) -> Resumed:
    """``steps`` batches on every old rank (as a loader reports them), save, load at w_new."""
    old = make(n, w_old, even=even, seed=seed)
    before: list[int] = []
    for s in old:
        share = list(s)
        before += share[: steps * bs]
        for _ in range(steps):
            s.advance(bs)
    states = [s.state_dict() for s in old]
    assert all(st == states[0] for st in states), "state must be identical on every rank"
    new = make(n, w_new, even=even, seed=seed)
    for s in new:
        s.load_state_dict(states[0])
    lengths = [len(s) for s in new]
    after = [list(s) for s in new]
    assert lengths == [len(a) for a in after]
    return Resumed(global_order(n, seed), states[0]["consumed_global"], before, after)


def check_resume(n: int, w_old: int, w_new: int, bs: int, steps: int, even: Even) -> None:
    r = run_and_resume(n, w_old, w_new, bs, steps, even)
    done_slots = steps * bs * w_old
    share_total = {"pad": -(-n // w_old) * w_old, "drop": n - n % w_old, "exact": n}[even]
    # consumed_global is the prefix the old ranks read; the whole epoch once the shares are done.
    assert r.consumed == (n if done_slots >= share_total else done_slots)
    read_prefix = set(r.order[: min(r.consumed, share_total)])
    assert set(r.before) == read_prefix
    unread = r.order[r.consumed :]
    rest = Counter(i for a in r.after for i in a)
    if even == "exact":
        assert sorted(rest.elements()) == sorted(unread)
        assert sorted(r.before + list(rest.elements())) == list(range(n))
    elif even == "pad":
        assert not Counter(unread) - rest  # every unread index is read
        extra = rest - Counter(unread)  # padding wraps from the epoch's start: repeats, and only it
        assert sum(extra.values()) == (-len(unread)) % w_new
    else:
        assert max(rest.values(), default=1) == 1 and set(rest) <= set(unread)
        assert len(unread) - len(rest) == len(unread) % w_new
    if even != "drop":
        assert max(map(len, r.after)) - min(map(len, r.after)) <= (1 if even == "exact" else 0)


@pytest.mark.parametrize("w_old,w_new", [(4, 2), (2, 4), (3, 2), (2, 3), (1, 3), (4, 1), (3, 3)])
@pytest.mark.parametrize("even", POLICIES)
@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("n", [0, 1, 10, 23])
def test_elastic_resume_reads_exactly_the_unread_part(
    n: int, w_old: int, w_new: int, bs: int, even: Even
) -> None:
    max_steps = -(-n // w_old) // bs + 1
    for steps in range(max_steps + 1):
        check_resume(n, w_old, w_new, bs, steps, even)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 90),
    w_old=st.integers(1, 6),
    w_new=st.integers(1, 6),
    bs=st.integers(1, 9),
    frac=st.floats(0, 1.2),
    even=st.sampled_from(POLICIES),
)
def test_elastic_resume_hypothesis(
    n: int, w_old: int, w_new: int, bs: int, frac: float, even: Even
) -> None:
    steps = int(frac * (-(-n // w_old) // bs + 1))
    check_resume(n, w_old, w_new, bs, steps, even)


@pytest.mark.parametrize("even", POLICIES)
def test_resume_at_same_world_size_continues_the_uninterrupted_run(even: Even) -> None:
    for rank in range(3):
        full = list(ShardedSampler(23, rank=rank, world_size=3, seed=9, even=even))
        s = ShardedSampler(23, rank=rank, world_size=3, seed=9, even=even)
        iter(s)
        s.advance(2)
        s.advance(2)
        again = ShardedSampler(23, rank=rank, world_size=3, seed=9, even=even)
        again.load_state_dict(s.state_dict())
        assert list(again) == full[4:]


def test_chained_elastic_resume_reads_each_index_once() -> None:
    n, seed, bs = 41, 2, 2
    seen: list[int] = []
    state = None
    for world, steps in [(4, 2), (2, 3), (3, 1), (1, 1000)]:
        samplers = make(n, world, seed=seed)
        for s in samplers:
            if state is not None:
                s.load_state_dict(state)
            share = list(s)
            take = min(steps, s.num_batches(bs))
            seen += share[: take * bs]
            for _ in range(take):
                s.advance(bs)
        states = [s.state_dict() for s in samplers]
        assert all(x == states[0] for x in states)
        state = states[0]
    assert sorted(seen) == list(range(n)) and state is not None and state["consumed_global"] == n


def test_state_and_len_follow_the_current_pass() -> None:
    s = ShardedSampler(10, rank=1, world_size=2, seed=0, even="exact")
    assert s.state_dict() == {
        "version": 1,
        "epoch": 0,
        "consumed_global": 0,
        "dataset_len": 10,
        "seed": 0,
        "shuffle": True,
        "world_size": 2,
        "even": "exact",
    }
    s.set_epoch(4)
    sd = dict(s.state_dict(), consumed_global=6)
    s.load_state_dict(sd)
    assert (len(s), s.num_batches(2), s.state_dict()["consumed_global"]) == (2, 1, 6)
    s.set_epoch(4)  # the usual "set_epoch(start_epoch)" after loading keeps the position
    assert len(s) == 2
    assert list(s) == global_order(10, 0, 4)[6:][1::2]
    s.advance(2)  # the whole share: the epoch is read
    assert s.state_dict()["consumed_global"] == 10
    s.set_epoch(5)  # a new epoch starts at 0
    assert (len(s), s.state_dict()["consumed_global"]) == (5, 0)


def test_end_of_data_step_counts_like_a_full_batch() -> None:
    # shares 3,3,2,2; batch 3 -> rank 2's only batch is short ([x, y]) and that is its last
    samplers = make(10, 4)
    for s in samplers:
        iter(s)
        s.advance(3)  # nominal slots, whatever the batch held
    assert {s.state_dict()["consumed_global"] for s in samplers} == {10}


def test_load_state_dict_rejects_a_different_order() -> None:
    s = ShardedSampler(10, rank=0, world_size=2, seed=1)
    sd = ShardedSampler(10, rank=0, world_size=4, seed=2).state_dict()
    with pytest.raises(ValueError) as info:
        s.load_state_dict(sd)
    assert str(info.value) == (
        "cannot resume: the state was saved with seed=2 but this sampler has seed=1; the "
        "epoch's order depends on dataset_len, seed, shuffle, so build the sampler with the "
        "saved values"
    )
    with pytest.raises(ValueError, match=r"missing \['version'"):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match=r"consumed_global=11 is outside \[0, dataset_len=10\]"):
        s.load_state_dict(dict(s.state_dict(), consumed_global=11))


def test_advance_before_iter_after_load_is_an_error() -> None:
    s = ShardedSampler(10, rank=0, world_size=2)
    s.load_state_dict(s.state_dict())
    with pytest.raises(RuntimeError, match=r"^advance\(\) was called after load_state_dict"):
        s.advance(1)


def test_constructor_errors() -> None:
    with pytest.raises(ValueError) as info:
        ShardedSampler(10, rank=2, world_size=2)
    assert str(info.value) == (
        "rank=2 is out of range for world_size=2: expected world_size >= 1 and 0 <= rank < "
        "world_size"
    )
    with pytest.raises(ValueError) as info:
        ShardedSampler(10, rank=0, world_size=2, drop_last=True, even="exact")
    assert str(info.value) == (
        "drop_last=True contradicts even='exact': drop_last=True is DistributedSampler's "
        "spelling of even='drop'; pass one of them"
    )
    with pytest.raises(ValueError, match=r"^even='odd' is not one of"):
        ShardedSampler(10, rank=0, world_size=2, even="odd")  # type: ignore[arg-type]
    assert len(ShardedSampler(list(range(7)), rank=0, world_size=2)) == 4  # a Sized works


# -- epoch autopilot ---------------------------------------------------------------------------


def test_autopilot_bumps_a_distributed_sampler_the_user_forgot() -> None:
    sampler: DistributedSampler[int] = DistributedSampler(Ints(8), num_replicas=2, rank=0)
    batches = BatchSampler(sampler, 2, drop_last=False)
    orders = []
    for _ in range(3):
        (decision,) = begin_epoch(sampler, batches)
        orders.append(list(batches))
        assert decision.target is sampler and decision.epoch == sampler.epoch
    assert [sampler.epoch, len({str(o) for o in orders})] == [2, 3]


def test_autopilot_leaves_user_managed_epochs_alone() -> None:
    sampler: DistributedSampler[int] = DistributedSampler(Ints(8), num_replicas=2, rank=0)
    actions = []
    for epoch in (5, 6, 7):
        sampler.set_epoch(epoch)
        actions += [(d.action, d.epoch) for d in begin_epoch(sampler)]
        list(sampler)
    assert actions == [("first", 5), ("user", 6), ("user", 7)]
    assert begin_epoch(sampler)[0].action == "auto" and sampler.epoch == 8  # user stopped


def test_autopilot_on_sharded_sampler_counts_explicit_calls() -> None:
    s = ShardedSampler(8, rank=0, world_size=2)
    batches = BatchSampler(s, 2, drop_last=False)
    assert [d.action for d in begin_epoch(SequentialSampler(range(8)), batches)] == ["first"]
    list(batches)
    assert [(d.action, d.epoch) for d in begin_epoch(s)] == [("auto", 1)]
    list(s)
    s.set_epoch(1)  # same value, but an explicit call: the user runs the epochs
    assert [(d.action, d.epoch) for d in begin_epoch(s)] == [("user", 1)]
    list(s)
    s.load_state_dict(s.state_dict())
    assert [d.action for d in begin_epoch(s)] == ["user"]


def test_auto_set_epoch_reaches_every_target_once() -> None:
    inner = ShardedSampler(8, rank=0, world_size=2)
    batches = BatchSampler(inner, 2, drop_last=False)
    assert auto_set_epoch(inner, 3, batches) == [inner] and inner.epoch == 3
    assert auto_set_epoch(SequentialSampler(range(3)), 1) == []
    assert begin_epoch(SequentialSampler(range(3))) == []


# -- EndOfData ----------------------------------------------------------------------------


def test_end_of_data_is_an_explicit_empty_marker() -> None:
    marker = EndOfData(rank=1, step=4, num_batches=5)
    assert not marker and len(marker) == 0
    assert repr(marker) == "EndOfData(rank=1, step=4, num_batches=5)"
    with pytest.raises(TypeError):
        x, y = marker  # type: ignore[misc]


# -- rank detection --------------------------------------------------------------------------


def test_detect_reads_torchrun_variables() -> None:
    ctx = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (ctx, ctx.local_rank, ctx.source, ctx.is_distributed) == (
        DistContext(3, 4),
        1,
        "env",
        True,
    )
    assert detect({}) == DistContext(0, 1) and detect({}).source == "default"


def test_detect_errors_name_the_variable() -> None:
    with pytest.raises(ValueError) as info:
        detect({"RANK": "1"})
    assert str(info.value) == (
        "RANK='1' is set but WORLD_SIZE is not: a launcher such as torchrun sets both; set "
        "WORLD_SIZE too, or unset RANK to run as a single process"
    )
    with pytest.raises(ValueError, match=r"^environment variable WORLD_SIZE='two' is not"):
        detect({"RANK": "1", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError) as info:
        detect({"RANK": "4", "WORLD_SIZE": "4"})
    assert str(info.value) == (
        "from the environment: DistContext(rank=4, world_size=4) is invalid: expected "
        "world_size >= 1 and 0 <= rank < world_size"
    )


def test_pinned_context_wins() -> None:
    set_context(DistContext(1, 2, source="pinned"))
    try:
        assert detect({"RANK": "0", "WORLD_SIZE": "8"}) == DistContext(1, 2)
    finally:
        set_context(None)
    assert detect({}) == DistContext(0, 1)


# -- iterable shards ---------------------------------------------------------------------------


def test_shard_info_in_main_process_and_in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = DistContext(1, 3)
    assert shard_info(ctx) == ShardInfo(1, 3, worker_id=0, num_workers=1)
    info = torch_worker.WorkerInfo(id=1, num_workers=2, seed=0, dataset=Ints(0))
    monkeypatch.setattr(torch_worker, "_worker_info", info)
    shard = shard_info(ctx)
    assert (shard.shard_id, shard.num_shards) == (3, 6)


@pytest.mark.parametrize("world,workers,n", [(1, 1, 5), (2, 3, 20), (3, 2, 5), (4, 4, 100)])
def test_every_element_lands_in_exactly_one_shard(world: int, workers: int, n: int) -> None:
    grid = [ShardInfo(r, world, w, workers) for r in range(world) for w in range(workers)]
    assert sorted(g.shard_id for g in grid) == list(range(world * workers))
    streamed = [x for g in grid for x in shard_iterable(iter(range(n)), g)]
    listed = [x for g in grid for x in shard_list(list(range(n)), g)]
    assert sorted(streamed) == sorted(listed) == list(range(n))
