"""NOTE [ One switch for the fast paths ]: ``fast_paths=False`` / ``STOKER_FAST_PATHS=0`` turn
every fast path that relies on interpreter or library internals off; stoker says once, at INFO,
when a ``__getitem__`` stops being called per sample; a batched form is never compiled from a
source file edited after import."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest
import torch
from torch.utils.data import Dataset
from torch.utils.data._utils import collate as torch_collate

import stoker


@pytest.fixture(autouse=True)
def _beyond_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this module tests is beyond torch (NOTE [ Same as torch unless asked ]): asked
    for through the environment, as for a script that cannot be edited."""
    monkeypatch.setenv("STOKER_BEYOND_TORCH", "batched_getitem,shared_lists,slab_transport")


class Gathers(Dataset):
    def __init__(self, n: int = 64) -> None:
        self.x = torch.arange(n * 2.0).reshape(n, 2)
        self.y = list(range(n))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class WhatTheWorkerSees(Dataset):
    """Reports, from inside a worker, whether its list and torch's collate map are torch's."""

    def __init__(self, n: int = 70_000) -> None:
        self.paths = [f"img_{k}.jpg" for k in range(n)]

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        plain_list = type(self.paths) is list
        torch_collate_fn = (
            torch_collate.default_collate_fn_map[torch.Tensor] is torch_collate.collate_tensor_fn
        )
        return torch.tensor([plain_list, torch_collate_fn])


def test_on_by_default_and_said_once_at_debug(caplog):
    loader = stoker.DataLoader(Gathers(), batch_size=8)
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        list(loader)
        list(loader)
    assert loader.stats().batched == 16 - 2  # all but the two probe batches
    said = [r.getMessage() for r in caplog.records if "per sample" in r.getMessage()]
    assert {r.levelno for r in caplog.records if "per sample" in r.getMessage()} == {logging.DEBUG}
    assert said == [
        f"stoker: {__name__}.Gathers.__getitem__ is no longer called per sample: its batched "
        "form, read from its source, gave the same batches as calling it per sample on the "
        "probe batches, so each batch is computed as array gathers. "
        "DataLoader(fast_paths=False) or STOKER_FAST_PATHS=0 calls it per sample "
        "(NOTE [ One switch for the fast paths ])."
    ]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_off_calls_getitem_per_sample_everywhere(how, monkeypatch):
    kwargs = {"fast_paths": False} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("STOKER_FAST_PATHS", "0")
    expected = [torch.utils.data.default_collate([Gathers()[i] for i in range(k, k + 8)])
                for k in range(0, 64, 8)]
    for num_workers in (0, 2):
        loader = stoker.DataLoader(Gathers(), batch_size=8, num_workers=num_workers, **kwargs)
        got = list(loader)
        stats = loader.stats()
        assert (stats.batched, stats.inline) == (0, False)
        assert all(torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])
                   for a, b in zip(got, expected, strict=True))
    seen = torch.cat(list(stoker.DataLoader(WhatTheWorkerSees(), batch_size=4, num_workers=2,
                                            **kwargs)))
    assert seen.tolist() == [[True, True]] * 8


def test_on_workers_get_a_list_stand_in_and_stokers_collate():
    seen = torch.cat(list(stoker.DataLoader(WhatTheWorkerSees(), batch_size=4, num_workers=2)))
    assert seen.tolist() == [[False, False]] * 8


_ORIGINAL = '''
class Scaled:
    def __init__(self):
        import torch
        self.x = torch.arange(32.0)

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return self.x[i] * 2
'''


def test_a_source_file_edited_after_import_is_not_compiled(tmp_path, monkeypatch):
    path = tmp_path / "edited_dataset.py"
    path.write_text(_ORIGINAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_dataset")
    try:
        # An edit that agrees with the running code on the probe batches (values below 40),
        # not after: only comparing the source with the code can tell.
        path.write_text(_ORIGINAL.replace("self.x[i] * 2", "self.x[i] * 2 % 40  # edited"))
        loader = stoker.DataLoader(module.Scaled(), batch_size=8)
        got = torch.cat(list(loader))
        assert got.tolist() == [2.0 * k for k in range(32)]  # the running code's values
        assert loader.stats().batched == 0
    finally:
        sys.modules.pop("edited_dataset", None)


def test_an_unedited_source_file_is_compiled(tmp_path, monkeypatch):
    path = tmp_path / "unedited_dataset.py"
    path.write_text(_ORIGINAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("unedited_dataset")
    try:
        loader = stoker.DataLoader(module.Scaled(), batch_size=8)
        assert torch.cat(list(loader)).tolist() == [2.0 * k for k in range(32)]
        assert loader.stats().batched == 4 - 2
    finally:
        sys.modules.pop("unedited_dataset", None)
