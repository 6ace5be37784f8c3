"""``_core.torch_own``: torch's own function, told from a program's version of it."""

from __future__ import annotations

import functools

import torch.utils.data.sampler
from torch.utils.data import RandomSampler, TensorDataset
from torch.utils.data._utils import collate as torch_collate

from stoker._core.torch_own import torchs_own


def test_torchs_functions_methods_and_properties_are_its_own():
    assert torchs_own(torch_collate.default_collate, torch_collate, "default_collate")
    assert torchs_own(TensorDataset.__getitem__, torch.utils.data.dataset, "__getitem__")
    assert torchs_own(vars(RandomSampler)["num_samples"], torch.utils.data.sampler, "num_samples")


def test_a_wrapper_a_namesake_or_nothing_is_not():
    stock = torch_collate.default_collate

    @functools.wraps(stock)
    def default_collate(batch):  # type: ignore[no-untyped-def]  # its very name, elsewhere
        return stock(batch)

    wrapped = default_collate
    assert wrapped.__module__ == stock.__module__ and wrapped.__qualname__ == stock.__qualname__
    assert not torchs_own(wrapped, torch_collate, "default_collate")
    # torch's, but another of its functions than the name asked for
    assert not torchs_own(torch_collate.default_convert, torch_collate, "default_collate")
    assert not torchs_own(stock, torch.utils.data.sampler, "default_collate")
    assert not torchs_own(None, torch_collate, "default_collate")
    assert not torchs_own(len, torch_collate, "len")  # a builtin has no code to read
