"""NOTE [ A stream's samples have no index ]: ``stoker.sample_rng()`` in an ``IterableDataset``
says what to use there (not that it was called outside a loader), and ``TarShardStream`` seeds
its ``transform``'s draws per sample, from its seed, its epoch and the sample's shard and key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import stoker
from _tar_samples import draw, write_shards
from stoker.formats import TarShardStream

IN_STREAM = (
    "stoker.sample_seed()/sample_rng()/sample_generator() seed from the index of the sample "
    "being loaded, and an IterableDataset's samples have none (they come out of its "
    "iterator). In an IterableDataset, make one generator per worker in __iter__, e.g. "
    "numpy.random.default_rng(torch.initial_seed()) (torch seeds each worker differently, and "
    "the main process at num_workers=0), and draw from it; or use a map-style dataset. "
    "TarShardStream's transform may call them: it seeds each sample from its shard and key."
)
OUTSIDE = (
    "stoker.sample_seed()/sample_rng()/sample_generator() only work while a stoker "
    "DataLoader is loading a sample (inside Dataset.__getitem__). Outside a loader, create "
    "your own generator, e.g. numpy.random.default_rng(seed)."
)


def _draws(stream: TarShardStream) -> dict[int, int]:
    out = dict(stream)
    assert sorted(out) == list(range(15))
    return out


def test_a_streams_transform_draws_per_sample_whatever_the_order(tmp_path: Path) -> None:
    paths = write_shards(tmp_path)
    first = _draws(TarShardStream(paths, transform=draw, shuffle_buffer=0, seed=3))
    assert len(set(first.values())) == 15
    assert _draws(TarShardStream(paths, transform=draw, shuffle_buffer=10, seed=3)) == first
    other_seed = _draws(TarShardStream(paths, transform=draw, shuffle_buffer=0, seed=4))
    assert all(other_seed[i] != first[i] for i in first)
    stream = TarShardStream(paths, transform=draw, shuffle_buffer=0, seed=3)
    stream.set_epoch(1)
    assert all(_draws(stream)[i] != first[i] for i in first)
    with pytest.raises(RuntimeError) as info:  # the context is left as it was
        stoker.sample_rng()
    assert str(info.value) == OUTSIDE


def test_the_draws_are_the_same_through_either_loader(tmp_path: Path) -> None:
    paths = write_shards(tmp_path)
    alone = _draws(TarShardStream(paths, transform=draw, shuffle_buffer=4, seed=3))
    for cls in (stoker.DataLoader, torch.utils.data.DataLoader):
        stream = TarShardStream(paths, transform=draw, shuffle_buffer=4, seed=3)
        loader = cls(stream, batch_size=None)
        assert {int(i): int(d) for i, d in loader} == alone


class DrawsInIter(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        yield 1
        yield int(stoker.sample_rng().integers(10))


@pytest.mark.parametrize("batch_size", [None, 2])
def test_sample_rng_in_an_iterable_dataset_says_what_to_use(batch_size: int | None) -> None:
    loader = stoker.DataLoader(DrawsInIter(), batch_size=batch_size)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    assert str(info.value) == IN_STREAM
    with pytest.raises(RuntimeError) as outside:
        stoker.sample_rng()
    assert str(outside.value) == OUTSIDE


def test_the_draws_are_the_same_after_a_resume(tmp_path: Path) -> None:
    paths = write_shards(tmp_path)

    def loader() -> stoker.DataLoader:
        stream = TarShardStream(paths, transform=draw, shuffle_buffer=4, seed=3)
        return stoker.DataLoader(stream, batch_size=3)

    whole = [b.tolist() for b in map(torch.stack, loader())]
    first = loader()
    it = iter(first)
    head = [torch.stack(next(it)).tolist() for _ in range(2)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="by reading its first 2 batches again"):
        tail = [torch.stack(b).tolist() for b in resumed]
    assert head + tail == whole
