"""``loader.stats()`` on a torchvision-style image pipeline names the ``stoker.vision`` import
with its gain measured on the loader's own files (profile/stats_advice.py,
vision/import_gain.py); nothing for any other dataset, the user's RNG state left as it was.

torchvision cannot be installed beside the CPU torch, so the as-written pipeline here is
stoker.vision's with fusion off (torchvision's algorithms call for call; recognised the same
way); tests/unit/test_vision_torchvision.py checks torchvision's own objects where it can."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker

Image = pytest.importorskip("PIL.Image")

from stoker.profile import verdict  # noqa: E402
from stoker.vision import datasets, import_gain, stats_advice  # noqa: E402
from stoker.vision import transforms as T  # noqa: E402


def _folder(root: Path, count: int = 6) -> str:
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
        path = root / f"class{i % 2}" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG", quality=90)
        path.write_bytes(out.getvalue())
    return str(root)


def _train(fuse: bool) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))], fuse=fuse)


def _drained(dataset) -> stoker.DataLoader:
    loader = stoker.DataLoader(dataset, batch_size=2, num_workers=0)
    for _ in loader:
        pass
    return loader


def test_the_import_is_named_with_its_gain_on_an_input_bound_loader(tmp_path, monkeypatch):
    monkeypatch.setattr(stats_advice, "_WORTH", 0.0)  # any measured gain is shown here
    loader = _drained(datasets.ImageFolder(_folder(tmp_path), transform=_train(fuse=False)))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    stats = loader.stats()
    assert torch.equal(before, torch.get_rng_state())  # the measure's draws are put back
    said = [a for a in stats.advice if "`from stoker.vision import datasets, transforms`" in a]
    if verdict.kind(stats) in verdict.CPU_BOUND:  # the loop waited for __getitem__'s work
        assert len(said) == 1 and "on 6 of this loader's own files" in said[0], stats.advice
        assert "`from torchvision import datasets, transforms`" in said[0]
        assert f"Also: {said[0]}." in stats.summary
        assert loader.stats().advice == stats.advice  # measured once, said once
    else:  # a machine too busy to judge (contention): no advice rests on its figures
        assert said == [] and loader.dataset not in stats_advice._measured


def test_the_gain_is_measured_on_the_datasets_own_files(tmp_path) -> None:
    dataset = datasets.ImageFolder(_folder(tmp_path), transform=_train(fuse=False))
    torch.manual_seed(0)
    state = torch.get_rng_state()
    gain = import_gain.measure(dataset, budget_s=0.0)  # one pass over the files
    assert torch.equal(state, torch.get_rng_state())
    assert gain is not None and gain.images == 6
    assert gain.as_written_ms > 0 and gain.fused_ms > 0
    assert gain.as_dict()["ratio"] == pytest.approx(gain.as_written_ms / gain.fused_ms)


def test_what_is_recognised(tmp_path) -> None:
    root = _folder(tmp_path)
    fused = datasets.ImageFolder(root, transform=_train(fuse=True))
    assert import_gain.recognise(fused) is None  # already on the fused path
    found = import_gain.recognise(datasets.ImageFolder(root, transform=_train(fuse=False)))
    assert found is not None and len(found[0]) == 6 and found[1].fused_plan() is not None
    not_fusable = [
        T.Compose([T.CenterCrop(64), T.ToTensor()], fuse=False),  # nothing it fuses first
        T.Compose([T.RandomResizedCrop(64), str], fuse=False),  # a transform it does not have
        _train(fuse=False).transforms[0],  # not a Compose
        lambda img: img,
    ]
    for transform in not_fusable:
        assert import_gain.recognise(datasets.ImageFolder(root, transform=transform)) is None
    own_loader = datasets.ImageFolder(root, transform=_train(fuse=False),
                                      loader=lambda p: Image.open(p).convert("RGB"))
    assert import_gain.recognise(own_loader) is None  # a loader of its own: not ours to judge


def test_no_advice_and_no_measure_for_other_datasets(tmp_path) -> None:
    root = _folder(tmp_path)
    for dataset in (datasets.ImageFolder(root, transform=_train(fuse=True)),
                    torch.utils.data.TensorDataset(torch.arange(8))):
        loader = _drained(dataset)
        stats = loader.stats()
        assert not any("stoker.vision" in a for a in stats.advice)
        assert "stoker.vision" not in stats.summary
        assert stats_advice._measured.get(loader.dataset) is None  # nothing measured
