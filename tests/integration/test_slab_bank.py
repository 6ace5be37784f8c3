"""Slabs kept between worker generations (NOTE [ Slabs outlive workers ]): real loaders, real
forked workers. New workers write into the slabs the last ones used, never into one whose batch
the user still holds, and the results stay torch's."""

from __future__ import annotations

import gc

import pytest
import torch

import stoker


@pytest.fixture(autouse=True)
def _beyond_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this module tests is beyond torch (NOTE [ Same as torch unless asked ]): asked
    for through the environment, as for a script that cannot be edited."""
    monkeypatch.setenv("STOKER_BEYOND_TORCH", "keep_slabs")


class Rows(torch.utils.data.Dataset):
    """64 KiB per sample, so batches are large enough that slab reuse is what matters."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        return {"x": torch.full((16384,), float(i)), "i": i}


def _loader(**kwargs):
    args = dict(batch_size=4, shuffle=True, num_workers=2)
    args["generator"] = torch.Generator().manual_seed(3)
    args.update(kwargs)
    return stoker.DataLoader(Rows(), **args)


def _slab_of(ptr: int, slabs) -> bool:
    return any(s.address <= ptr < s.address + s.nbytes for s in slabs)


def _banked(loader):
    return [s for group in loader._engine.slab_bank._slabs.values() for s in group]


def test_the_next_epoch_writes_into_the_slabs_the_last_workers_left():
    loader = _loader()
    for _ in loader:
        pass
    gc.collect()
    banked = _banked(loader)
    assert len(banked) >= 2  # each worker's slabs, mappings kept
    second = [b["x"].data_ptr() for b in loader]
    # each new worker's first batches go into the slabs its predecessor left
    assert sum(_slab_of(p, banked) for p in second) >= 2


def test_batches_held_across_epochs_are_never_overwritten():
    loader = _loader()
    held = list(loader)  # every slab of epoch 1 is still read by the user
    copies = [{"x": b["x"].clone(), "i": b["i"].clone()} for b in held]
    for _ in range(3):
        for _ in loader:
            pass
    for b, c in zip(held, copies, strict=True):
        assert torch.equal(b["x"], c["x"]) and torch.equal(b["i"], c["i"])
    addresses = {b["x"].data_ptr() for b in held}
    del held, b
    gc.collect()
    banked = _banked(loader)
    assert any(_slab_of(p, banked) for p in addresses)  # released: banked for a later epoch


@pytest.mark.parametrize("persistent", [False, True])
def test_batches_match_torch_over_epochs(persistent):
    kwargs = dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=persistent)
    ours = stoker.DataLoader(Rows(), generator=torch.Generator().manual_seed(5), **kwargs)
    theirs = torch.utils.data.DataLoader(
        Rows(), generator=torch.Generator().manual_seed(5), **kwargs
    )
    for _ in range(3):
        got, want = list(ours), list(theirs)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g["x"], w["x"]) and torch.equal(g["i"], w["i"])


def test_spawned_workers_get_no_banked_slabs():
    loader = _loader(multiprocessing_context="spawn")
    for _ in range(2):
        assert [b["i"].shape for b in loader] == [torch.Size([4])] * 12
    assert _banked(loader) == []


def test_deleting_the_loader_frees_the_bank():
    loader = _loader()
    list(loader)
    gc.collect()
    assert _banked(loader)
    del loader
    gc.collect()
    with open("/proc/self/maps") as f:
        assert not any("stoker-slab" in line for line in f)
