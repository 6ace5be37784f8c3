"""``assert_resumes_exactly`` over every record-format reader, through stoker's loader: the
readers are map-style, so a shuffled epoch resumes exactly from any batch, with workers or
without, and with a different ``num_workers`` after the resume. Each reader's samples carry
their index, so a lost or repeated sample would show.

The tar reader's transform draws a random augmentation. Resumes with the ``num_workers`` they
saved with run under explicit per-batch seeding and under the default, torch's per-worker
seeding (the ``seeding`` fixture in ``conftest.py``, whose docstring says why the default's
loaders seed the global RNGs first); a resume at another ``num_workers`` is a promise of
per-batch seeding alone (under torch's seeding the rest of the epoch depends on which worker
loads which batch), so that test names it alone."""

from __future__ import annotations

import io
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _seeding import seeding_kwargs

import stoker
from stoker.formats import TarShards, pack
from stoker.testing import assert_resumes_exactly

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from _format_files import READERS, tensor_reader, write_all  # noqa: E402

N = 17


class Numbered(torch.utils.data.Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"npy": np.full(3, i, dtype=np.int64), "cls": i}


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Tar sample -> tensors, plus a random augmentation (the state carries what it draws)."""
    x = torch.from_numpy(np.load(io.BytesIO(sample["npy"])))
    return {"x": x, "cls": int(sample["cls"]), "aug": random.random()}


@pytest.fixture(scope="module")
def tar_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tar") / "out"
    pack(Numbered(), str(out), samples_per_shard=5, workers=1, progress=False)
    return str(out)


def _loaders(dataset: Any, num_workers: int, seeding: str = "per_batch") -> Callable[[], Any]:
    """``seeding="default"`` names none (torch's) and seeds the global RNGs first, as a script
    does at its start (``conftest.seeding``)."""
    def make() -> Any:
        return stoker.DataLoader(
            dataset, batch_size=3, shuffle=True, num_workers=num_workers,
            generator=torch.Generator().manual_seed(5), **seeding_kwargs(seeding),
        )

    return make


def test_tar_reader_resumes_every_step_with_augmentations(tar_dir: str, seeding: str) -> None:
    dataset = TarShards(tar_dir, transform=decode)
    assert sorted(int(dataset[i]["x"][0]) for i in range(len(dataset))) == list(range(N))
    assert_resumes_exactly(_loaders(dataset, 0, seeding), epochs=2)


def test_tar_reader_resumes_with_workers_with_augmentations(tar_dir: str, seeding: str) -> None:
    dataset = TarShards(tar_dir, transform=decode)
    assert_resumes_exactly(_loaders(dataset, 2, seeding), epochs=2, steps=4)


@pytest.fixture(scope="module")
def readers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_all(str(tmp_path_factory.mktemp("formats")))


@pytest.mark.parametrize("reader", READERS)
def test_reader_resumes_every_step_inline(
    readers: dict[str, Any], reader: str, seeding: str
) -> None:
    dataset = tensor_reader(readers, reader)
    assert_resumes_exactly(_loaders(dataset, 0, seeding), epochs=2, steps=8)


@pytest.mark.parametrize("reader", READERS)
def test_reader_resumes_with_workers_and_another_worker_count(
    readers: dict[str, Any], reader: str
) -> None:
    # Per-batch seeding only (module docstring).
    dataset = tensor_reader(readers, reader)
    assert_resumes_exactly(
        _loaders(dataset, 2), epochs=2, steps=4, resume_loader=_loaders(dataset, 1)
    )
