"""The batched-call probe (NOTE [ Vectorised fetch ]) leaves no trace in the RNGs: a candidate
call that draws is dropped, and the global RNGs and those the dataset owns are put back."""

from __future__ import annotations

import random

import numpy as np
import torch

from stoker.collate import default_collate
from stoker.fastpaths.index_tensor import VectorProbe
from stoker.sampling import global_rngs


class DrawsPerCall(torch.utils.data.Dataset):
    """Indexable by a tensor of indices, but draws once per call: not batchable."""

    stoker_tensor_index = True  # a wrong promise: the probe still catches it

    def __init__(self) -> None:
        self.x = torch.arange(32.0)
        self.rng = np.random.default_rng(7)

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i):
        noise = torch.rand(()) + np.random.rand() + random.random() + self.rng.random()
        return self.x[i] + noise


class Plain(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.x = torch.arange(32.0)

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i):
        return self.x[i] * 2


def _states(ds):
    owned = ds.rng.bit_generator.state if hasattr(ds, "rng") else None
    return global_rngs.snapshot(), owned


def test_a_candidate_that_draws_is_dropped_and_every_rng_put_back():
    ds = DrawsPerCall()
    probe = VectorProbe(ds, eligible=True, source=True)
    assert probe.kind == "call"
    indices = [3, 1, 4]
    plain = default_collate([ds[i] for i in indices])
    before, owned = _states(ds)
    probe.check(indices, plain)
    assert not probe.probing  # dropped: it drew
    assert not global_rngs.changed_since(before)
    assert ds.rng.bit_generator.state == owned


def test_a_candidate_that_agrees_is_adopted_after_its_probes():
    ds = Plain()
    probe = VectorProbe(ds, eligible=True, source=True)
    for indices in ([0, 5, 2], [7, 1]):
        assert probe.probing
        probe.check(indices, default_collate([ds[i] for i in indices]))
    assert probe.adopted
    assert torch.equal(probe.fetch([4, 6]), torch.tensor([8.0, 12.0]))


class NormalisedPerCall(torch.utils.data.Dataset):
    """Takes a tensor of indices, but ``max`` then reduces over the whole batch."""

    def __init__(self) -> None:
        self.x = torch.arange(1.0, 33.0)

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i):
        x = self.x[i]
        return x / x.abs().max()


def test_a_tensor_of_indices_is_tried_only_when_the_class_promises_it():
    assert VectorProbe(NormalisedPerCall(), eligible=True).kind is None

    class Promised(NormalisedPerCall):
        stoker_tensor_index = True

    assert VectorProbe(Promised(), eligible=True).kind == "call"
