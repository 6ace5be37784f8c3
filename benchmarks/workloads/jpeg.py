"""`jpeg`: ImageNet-style CPU-bound input pipeline: PIL decode of ~256x256..500x375 JPEGs,
random-resized-crop to 224 and random flip, batch 64, num_workers=2.

Also measures "the 2-core limit": a plain loop in this process decoding and augmenting
samples (no loader, no collate), its rate times the usable CPU count. The plain loop runs right
before and right after each loader (a core's speed drifts within seconds on a shared machine),
and each loader's record carries its fraction of the limit from the mean of the two. As a
diagnostic, `two_process_plain_samples_per_s` is what two plain loops in two forked processes
reach together: the machine's own ceiling with both cores busy, which can sit below the limit.

Variant `thread_safe`: the same images through a class that promises thread-safety (the
opt-in of NOTE [ Automatic concurrency ]); stoker's default never runs a worker's fetches on
threads without that promise.
"""

from __future__ import annotations

import multiprocessing
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _harness import Context, Plan, compare, compare_interleaved

import stoker
from stoker.cli.demo import JpegDataset, decode_and_augment, make_jpeg_files


class ThreadSafeJpegDataset(JpegDataset):
    """The same samples; the class promises thread-safety (NOTE [ Automatic concurrency ]):
    its random draws come from a generator seeded for the sample, under stoker, and from
    `random` under torch, which ignores the attribute."""

    stoker_thread_safe = True

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        try:
            rng = random.Random(stoker.sample_seed())
        except RuntimeError:  # not loading under stoker
            rng = None
        return decode_and_augment(self.paths[index], self.size, rng), self.labels[index]


def single_process_rate(dataset: JpegDataset, count: int, warmup: int = 8) -> float:
    """Samples/s of decoding + augmenting `count` samples in a plain loop in this process."""
    for i in range(min(warmup, len(dataset))):
        dataset[i]
    start = time.perf_counter()
    for i in range(count):
        dataset[i % len(dataset)]
    return count / (time.perf_counter() - start)


def _plain_loop(dataset: JpegDataset, first: int, count: int, out: Any) -> None:
    for i in range(first, first + 4):  # warm-up, outside the timed span
        dataset[i % len(dataset)]
    start = time.perf_counter()
    for i in range(first, first + count):
        dataset[i % len(dataset)]
    out.put((start, time.perf_counter()))


def parallel_plain_rate(dataset: JpegDataset, count: int, processes: int) -> float:
    """Samples/s of `processes` forked plain loops of `count` samples each, running at once
    (from the first loop's start to the last one's end; monotonic clocks are system-wide)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    procs = [
        ctx.Process(target=_plain_loop, args=(dataset, k * count, count, out))
        for k in range(processes)
    ]
    for p in procs:
        p.start()
    spans = [out.get() for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return processes * count / (max(e for _, e in spans) - min(s for s, _ in spans))


def run(ctx: Context) -> list[dict[str, Any]]:
    images = 64 if ctx.quick else 2000
    cache = Path(tempfile.gettempdir()) / f"stoker-bench-jpeg-n{images}"
    dataset = JpegDataset(make_jpeg_files(cache, images))
    cores = int(ctx.machine["cpus_usable"])
    count = 32 if ctx.quick else 300
    two_process = parallel_plain_rate(dataset, count, cores)
    if ctx.quick:
        kwargs = {"batch_size": 16, "shuffle": True, "num_workers": 2}
        plan = Plan(epochs=1, warmup_batches=1)
    else:
        kwargs = {"batch_size": 64, "shuffle": True, "num_workers": 2}
        plan = Plan(epochs=2, warmup_batches=4)

    def extra(record: dict[str, Any]) -> dict[str, Any]:
        single = (record["reference_before"] + record["reference_after"]) / 2
        limit = single * cores
        return {
            "images": images,
            "single_process_samples_per_s": single,
            "cores": cores,
            "core_limit_samples_per_s": limit,
            "fraction_of_core_limit": record["samples_per_s"] / limit,
            "two_process_plain_samples_per_s": two_process,
            "fraction_of_two_process_plain": record["samples_per_s"] / two_process,
        }

    def reference() -> float:
        return single_process_rate(dataset, count)

    records = compare(ctx, "jpeg", dataset, kwargs, plan, extra=extra, reference=reference)
    # The same, with the two loaders' epochs alternating: the machine's drift (a core's rate
    # moved 260-520 samples/s within seconds here) then slows both alike.
    before = reference()
    interleaved = compare_interleaved(
        ctx, "jpeg", dataset, kwargs, rounds=2 if ctx.quick else 6, variant="epochs interleaved"
    )
    after = reference()
    for record in interleaved:
        record.update(reference_before=before, reference_after=after)
        record.update(extra(record))
    # The opt-in: the dataset promises thread-safety, so stoker's workers may overlap decodes
    # on threads (Pillow releases the GIL while it decodes and resizes).
    safe = ThreadSafeJpegDataset(dataset.paths, dataset.size)
    threaded = compare(ctx, "jpeg", safe, kwargs, plan, variant="thread_safe", extra=extra,
                       reference=reference)
    return records + interleaved + threaded
