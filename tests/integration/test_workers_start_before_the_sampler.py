"""torch forks every worker before the sampler's first draw, so each worker starts with the
program's state as it was at ``iter()``. stoker gives a forked worker its first task before
forking the next (NOTE [ Tasks before the next fork ] in ``engine/worker_start.py``) only where
that draw changes nothing a later worker could read. Each test failed before that condition:
the second worker saw the sampler's draw (the generator's state, the sampler's writes).

Under ``STOKER_TEST_LOADER=torch`` both sides are torch's: the expectations are torch's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler


class SharedGenerator(Dataset):
    """Draws from the generator the loader shuffles with (one generator for the whole run)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        return i, torch.rand(1, generator=self.generator).item()


class Passes(Dataset):
    """Returns the sampler's count of passes, as its copy in the worker has it."""

    def __init__(self) -> None:
        self.passes = 0

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        return i, self.passes


class CountingSampler(Sampler[int]):
    """Counts its passes on the dataset, as a curriculum sampler might."""

    def __init__(self, dataset: Passes) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[int]:
        self.dataset.passes += 1
        return iter(range(len(self.dataset)))


def _run(cls: type, make: Any) -> list:
    loader = make(cls)
    return [[[t.tolist() for t in batch] for batch in loader] for _ in range(2)]


def test_a_generator_the_dataset_shares_with_the_sampler(Loader, TorchLoader):
    def make(cls: type) -> Any:
        generator = torch.Generator().manual_seed(7)
        return cls(SharedGenerator(generator), batch_size=4, shuffle=True, generator=generator,
                   num_workers=2, timeout=60)

    assert _run(Loader, make) == _run(TorchLoader, make)


def test_a_sampler_that_writes_into_the_dataset(Loader, TorchLoader):
    def make(cls: type) -> Any:
        ds = Passes()
        return cls(ds, batch_size=4, sampler=CountingSampler(ds), num_workers=2, timeout=60)

    torchs = _run(TorchLoader, make)
    assert _run(Loader, make) == torchs
    passes = {row[1] for batch in torchs[1] for row in zip(*batch, strict=True)}
    assert passes == {1}  # the workers of epoch 2 were forked after pass 1
