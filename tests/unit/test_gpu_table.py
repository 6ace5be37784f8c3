"""benchmarks/gpu_table.py: docs/gpu_feed.md's "Measured" tables rendered from a record of
benchmarks/gpu_feed.py (issue 46), on a sample record: every figure in its cell, every table
with its header row, the page's section rewritten between its markers and nowhere else."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_table", ROOT / "benchmarks" /
                                                  "gpu_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_table = _table()

EMITTED: dict[str, dict[str, dict[str, Any]]] = {
    "machine": {"machine": {"device": "NVIDIA H200", "cores": 16, "torch": "2.13.0+cu130",
                            "torchvision": "0.28.0"}},
    "decode_torch": {"torch_pillow": {"images_per_s": 12800.4, "cpu_s_per_image": 0.00121,
                                      "num_workers": 16}},
    "decode_stoker": {"stoker_image_path": {
        "images_per_s": 19950.0, "cpu_s_per_image": 0.00079, "num_workers": 16,
        "decoder": "simplejpeg, OpenCV resize"}},
    "decode_gpu": {
        "torchvision_bare": {"images_per_s": 6100.0, "cpu_s_per_image": 0.00011},
        "decode_images_bare": {"images_per_s": 5300.0, "cpu_s_per_image": 0.00015},
        "decode_images_loader": {"images_per_s": 4900.0, "cpu_s_per_image": 0.0002,
                                 "num_workers": 4}},
    "feed": {
        "image_uint8.plain": {"batches_per_s": 1400.0},
        "image_uint8.feed_only": {"batches_per_s": 1386.0, "share_of_plain": 0.99},
        "image_uint8.host_only": {"batches_per_s": 1372.0, "share_of_plain": 0.98},
        "image_uint8.stoker": {"batches_per_s": 700.0, "share_of_plain": 0.5},
        "image_uint8.stoker_best": {"batches_per_s": 1330.0, "share_of_plain": 0.95},
        "image_uint8.torch": {"batches_per_s": 112.0, "share_of_plain": 0.08},
        "tokens_int64.plain": {"batches_per_s": 9000.0},
        "tokens_int64.feed_only": {"batches_per_s": 4500.0, "share_of_plain": 0.5},
        "tokens_int64.host_only": {"batches_per_s": 8100.0, "share_of_plain": 0.9},
        "tokens_int64.stoker": {"batches_per_s": 1800.0, "share_of_plain": 0.2},
        "tokens_int64.stoker_best": {"batches_per_s": 2700.0, "share_of_plain": 0.3},
        "tokens_int64.torch": {"batches_per_s": 900.0, "share_of_plain": 0.1}},
    "step": {
        "resident": {"step_s": 0.0638, "model": "torchvision resnet50"},
        "torch": {"step_s": 0.0701, "ratio_to_resident": 1.0987, "num_workers": 16},
        "stoker_image_path": {"step_s": 0.0645, "ratio_to_resident": 1.011, "num_workers": 16},
        "stoker_gpu_decode": {"step_s": 0.0702, "ratio_to_resident": 1.1003,
                              "num_workers": 4}},
}


def _record(emitted: dict[str, Any]) -> dict[str, Any]:
    return {"date": "2026-12-24T10:00:00+00:00", "command": "benchmarks/gpu_feed.py",
            "dry_run": False, "machine": emitted.get("machine", {}).get("machine", {}),
            "sizes": {"width": 500, "height": 375, "out": 224, "batch": 256,
                      "image_batch": [256, 3, 224, 224], "token_batch": [64, 4096]},
            "parts": {name: {"status": "ok"} for name in emitted},
            "figures": gpu_table.figures_of(emitted)}


def test_every_figure_lands_in_its_cell() -> None:
    record = _record(EMITTED)
    assert gpu_table.missing_figures(record["figures"]) == []
    assert gpu_table.render(record) == "\n".join([
        "2026-12-24, NVIDIA H200 (16 cores, torch 2.13.0+cu130, torchvision 0.28.0), "
        "`benchmarks/gpu_feed.py`.",
        "",
        "| decode, 500x375 JPEGs to 224x224 | workers | images/s | CPU ms per image |",
        "| --- | --- | --- | --- |",
        "| (a) torch's DataLoader, Pillow + `RandomResizedCrop` in `__getitem__` | 16 | 12,800 "
        "| 1.21 |",
        "| (b) stoker's image path, `decode_crop_into` in `__getitem__` (simplejpeg, OpenCV "
        "resize) | 16 | 19,950 | 0.79 |",
        "| (c) `DecodeImages` on the GPU through stoker's loader | 4 | 4,900 | 0.20 |",
        "| `DecodeImages` on the GPU, bare loop (no loader) |  | 5,300 | 0.15 |",
        "| (d) torchvision's batched `decode_jpeg(device=\"cuda\")`, bare loop |  | 6,100 "
        "| 0.11 |",
        "",
        "| batches/s delivered on the GPU (share of the plain loop) | plain pinned-copy loop "
        "| stoker's feed alone, pre-made pinned batches (no workers) "
        "| host batches only, no copy (what the workers deliver) "
        "| stoker `device=` | `device=`, `beyond_torch=True` | torch, `pin_memory=True` + "
        "`.to()` |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        "| 256x3x224x224 uint8 | 1,400.0 | 1,386.0 (0.99) | 1,372.0 (0.98) | 700.0 (0.50) "
        "| 1,330.0 (0.95) | 112.0 (0.08) |",
        "| 64x4096 int64 | 9,000.0 | 4,500.0 (0.50) | 8,100.0 (0.90) | 1,800.0 (0.20) "
        "| 2,700.0 (0.30) | 900.0 (0.10) |",
        "",
        "| torchvision resnet50 step from the JPEG files (bf16, channels_last, batch 256) "
        "| workers | step ms | ratio to a resident batch (63.8 ms) |",
        "| --- | --- | --- | --- |",
        "| torch's DataLoader, Pillow in `__getitem__` (its best `num_workers`) | 16 | 70.1 "
        "| 1.099 |",
        "| stoker's image path, `device=` | 16 | 64.5 | 1.011 |",
        "| stoker, `device=` + `DecodeImages` (decode on the GPU) | 4 | 70.2 | 1.100 |",
        "",
        "- `DecodeImages` through stoker's loader: 0.80 of torchvision's bare batched loop "
        "(goal >= 0.8: met).",
        "- Per core: torch + Pillow 800 images/s, stoker's image path 1,247; one GPU decoding "
        "through stoker's loader does the work of 3.9 cores on the image path (6.1 with torch "
        "+ Pillow).",
        "- `device=` on the image batch: 0.50 of the plain pinned-copy loop (goal >= 0.9: not "
        "met); with `beyond_torch=True` 0.95.",
        "- The step from JPEG files with stoker's best setting: 1.011 of the resident step "
        "(goal <= 1.05: met); torch's DataLoader 1.099.",
    ])


def test_a_part_that_did_not_finish_shows_as_such() -> None:
    emitted = {k: v for k, v in EMITTED.items() if k != "feed"}
    record = _record(emitted)
    record["parts"]["feed"] = {"status": "timed out after 70 s"}
    assert gpu_table.missing_figures(record["figures"])[:2] == [
        "feed.image_uint8.plain_batches_per_s", "feed.image_uint8.feed_only_batches_per_s"]
    text = gpu_table.render(record)
    assert "; parts not completed: feed (timed out after 70 s)." in text.splitlines()[0]
    assert "| 256x3x224x224 uint8 | n/a | n/a (n/a) | n/a (n/a) | n/a (n/a) |" in text
    assert ("- `device=` on the image batch: n/a of the plain pinned-copy loop (goal >= 0.9: "
            "n/a); with `beyond_torch=True` n/a.") in text


def test_the_page_is_rewritten_between_its_markers_only() -> None:
    page = (ROOT / "docs" / "gpu_feed.md").read_text()
    assert page.count(gpu_table.BEGIN) == page.count(gpu_table.END) == 1
    text = gpu_table.render(_record(EMITTED))
    new = gpu_table.write(page, text)
    head, rest = page.split(gpu_table.BEGIN)
    tail = rest.split(gpu_table.END)[1]
    assert new == f"{head}{gpu_table.BEGIN}\n{text}\n{gpu_table.END}{tail}"
    assert gpu_table.write(new, text) == new
