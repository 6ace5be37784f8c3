"""`image_path`: the demo's tiers at benchmark size. torch's DataLoader over the user's dataset
(Pillow decode + RandomResizedCrop + flip in ``__getitem__``, as ``jpeg``) against
stoker.DataLoader over the same class with that one line on stoker's image path
(``stoker.image.decode_crop_into`` into a uint8 tensor, drawing from ``stoker.sample_rng()``):
the ratio is what the one-line change buys, the figure the README leads with (issue 33).

Each loader's record also carries its method's own bound: one core decoding with that method in
a plain loop here (no loader), measured right before and right after the loader, times the
usable cores; ``fraction_of_core_limit`` is how much of it the loader reached, and so how much
the loader around the decode costs (the 2-process plain loop, as in ``jpeg``, is the machine's
own ceiling with both cores busy). The image path draws from ``stoker.sample_rng()``, which
only a stoker loader gives, so torch runs the Pillow dataset only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _harness import Context, Plan, _finish, _loader_order, measure

from stoker.cli.demo import make_jpeg_files
from stoker.doctor.demo_workload import ImagePathJpegDataset, JpegDataset
from stoker.image import decode_crop_into
from workloads.jpeg import single_process_rate


class _ImagePathPlain:
    """``ImagePathJpegDataset.__getitem__``'s work outside a loader, for the plain loop: read,
    a generator seeded for the sample (what ``sample_rng()`` makes), decode_crop_into a new
    tensor."""

    def __init__(self, dataset: JpegDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.dataset.paths[i], "rb") as f:
            data = f.read()
        size = self.dataset.size
        out = torch.empty((3, size, size), dtype=torch.uint8)
        decode_crop_into(data, out, np.random.default_rng(i))
        return out


def _image_path_rate(dataset: JpegDataset, count: int) -> float:
    return single_process_rate(_ImagePathPlain(dataset), count)  # type: ignore[arg-type]


def run(ctx: Context) -> list[dict[str, Any]]:
    images = 64 if ctx.quick else 2000
    cache = Path(tempfile.gettempdir()) / f"stoker-bench-jpeg-n{images}"
    paths = make_jpeg_files(cache, images)
    pillow = JpegDataset(paths)
    image_path = ImagePathJpegDataset(paths)
    cores = int(ctx.machine["cpus_usable"])
    count = 32 if ctx.quick else 300
    if ctx.quick:
        kwargs = {"batch_size": 16, "shuffle": True, "num_workers": 2}
        plan = Plan(epochs=1, warmup_batches=1)
    else:
        kwargs = {"batch_size": 64, "shuffle": True, "num_workers": 2}
        plan = Plan(epochs=3, warmup_batches=4)
    records = []
    for position, name in enumerate(_loader_order(ctx)):
        torch_side = name == "torch"
        dataset = pillow if torch_side else image_path
        rate = single_process_rate if torch_side else _image_path_rate
        before = rate(dataset, count)
        record: dict[str, Any] = {"workload": "image_path", "variant": ""}
        record.update(measure(ctx, name, dataset, kwargs, plan))
        after = rate(dataset, count)
        single = (before + after) / 2
        record.update(
            dataset=type(dataset).__name__,
            method="Pillow in __getitem__" if torch_side else "stoker.image.decode_crop_into",
            images=images, run_position=position, cores=cores,
            reference_before=before, reference_after=after,
            single_process_samples_per_s=single,
            core_limit_samples_per_s=single * cores,
            fraction_of_core_limit=record["samples_per_s"] / (single * cores),
            loader_kwargs={k: repr(v) for k, v in kwargs.items()},
        )
        records.append(record)
    return _finish(ctx, records, None)
