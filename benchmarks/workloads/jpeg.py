"""`jpeg`: ImageNet-style CPU-bound input pipeline: PIL decode of ~256x256..500x375 JPEGs,
random-resized-crop to 224 and random flip, batch 64, num_workers=2.

Also measures "the 2-core limit": a plain loop in this process decoding and augmenting
samples (no loader, no collate), its rate times the usable CPU count; each loader's record
carries its fraction of that limit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import Context, Plan, compare

from stoker._demo import JpegDataset, make_jpeg_files


def single_process_rate(dataset: JpegDataset, count: int, warmup: int = 8) -> float:
    """Samples/s of decoding + augmenting `count` samples in a plain loop in this process."""
    for i in range(min(warmup, len(dataset))):
        dataset[i]
    start = time.perf_counter()
    for i in range(count):
        dataset[i % len(dataset)]
    return count / (time.perf_counter() - start)


def run(ctx: Context) -> list[dict[str, Any]]:
    images = 64 if ctx.quick else 2000
    cache = Path(tempfile.gettempdir()) / f"stoker-bench-jpeg-n{images}"
    dataset = JpegDataset(make_jpeg_files(cache, images))
    cores = int(ctx.machine["cpus_usable"])
    single = single_process_rate(dataset, 32 if ctx.quick else 400)
    limit = single * cores
    if ctx.quick:
        kwargs = {"batch_size": 16, "shuffle": True, "num_workers": 2}
        plan = Plan(epochs=1, warmup_batches=1)
    else:
        kwargs = {"batch_size": 64, "shuffle": True, "num_workers": 2}
        plan = Plan(epochs=2, warmup_batches=4)

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        return {
            "images": images,
            "single_process_samples_per_s": single,
            "cores": cores,
            "core_limit_samples_per_s": limit,
            "fraction_of_core_limit": record["samples_per_s"] / limit,
        }

    return compare(ctx, "jpeg", dataset, kwargs, plan, extra=extra)
