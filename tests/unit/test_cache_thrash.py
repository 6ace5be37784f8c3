"""NOTE [ A cache the order thrashes ]: the model of the shard cache warns about shuffled
orders the cache cannot hold, and about nothing else."""

from __future__ import annotations

import random

from stoker.formats.cache_thrash import ThrashWatch

SHARDS, PER_SHARD, SIZE = 20, 100, 2**20  # 2,000 samples in 20 shards of 1 MiB


def _replay(order: list[int], budget_shards: int, batch: int = 32) -> tuple[list[str], int]:
    """The warnings a watch gives over ``order`` (sample indices) in batches, and the batches
    seen when the first came (-1: none)."""
    watch = ThrashWatch(budget_shards * SIZE, PER_SHARD, SHARDS * SIZE)
    warned, at = [], -1
    for k in range(0, len(order), batch):
        indices = order[k : k + batch]
        message = watch.see({i // PER_SHARD: SIZE for i in indices}, len(indices))
        if message is not None:
            warned.append(message)
            at = k // batch + 1 if at < 0 else at
    return warned, at


def _shuffled(epochs: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(epochs):
        epoch = list(range(SHARDS * PER_SHARD))
        rng.shuffle(epoch)
        out += epoch
    return out


def test_a_shuffled_order_the_cache_cannot_hold_is_warned_about_once_with_the_switches() -> None:
    warned, at = _replay(_shuffled(3), budget_shards=5)
    assert len(warned) == 1
    assert 1 <= at <= 10  # within the first third of the first epoch (63 batches)
    samples = at * 32
    touched = len({i // PER_SHARD for i in _shuffled(3)[:samples]})
    again = int(warned[0].split("about ")[1].split(" ")[0])
    assert warned[0] == (
        f"TarShards: the sampler's order has read {samples} samples from shards scattered "
        f"over {touched}.0 MiB, and the shard cache holds 5.0 MiB: about {again} shards were "
        "evicted before they were read again and downloaded anew (a sequential read of those "
        f"samples downloads about {max(1, round(samples / PER_SHARD))}). Raise cache_bytes to "
        "the dataset's 20.0 MiB, "
        "read by range (open_source(..., fetch='range')), or stream the shards in order "
        "(TarShardStream)"
    )
    assert again >= max(8, 3 * samples / PER_SHARD)


def test_a_sequential_order_over_a_pack_larger_than_the_cache_is_not_warned_about() -> None:
    order = list(range(SHARDS * PER_SHARD)) * 4  # four passes, each shard once per pass
    assert _replay(order, budget_shards=3) == ([], -1)


def test_a_shuffled_order_the_cache_holds_is_not_warned_about() -> None:
    assert _replay(_shuffled(3), budget_shards=SHARDS) == ([], -1)


def test_a_ranks_scattered_share_with_room_for_every_shard_is_not_warned_about() -> None:
    """One rank of 8 reads an eighth of the samples, from every shard: first reads only."""
    order = [i for i in _shuffled(4) if i % 8 == 3]
    assert _replay(order, budget_shards=SHARDS) == ([], -1)


def test_a_cache_just_short_of_a_shuffled_order_is_warned_about() -> None:
    """Room for 18 of 20 shards: still about one sample in ten downloads its shard again."""
    warned, _ = _replay(_shuffled(3), budget_shards=18)
    assert len(warned) == 1
