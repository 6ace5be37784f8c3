"""What measuring costs: stoker.DataLoader with ``collect_stats=True`` (the default) against
``collect_stats=False`` on the tiny-samples workload, in the same run.

    .venv/bin/python benchmarks/stats_overhead.py             # 200,000 samples, 7 rounds
    .venv/bin/python benchmarks/stats_overhead.py --quick     # smoke run

``workloads/tiny.py``'s dataset (dicts of a float32[64] row and an int), ``batch_size=256``,
``shuffle=True``, for ``num_workers`` 0 and 2 (persistent workers, so epochs do not include
start-up). Four loaders are built once per variant: stats on, stats off, stats on again (an
A/A pair: the noise of this machine), and stats on with the doctor's per-batch timeline
recording. After a warm-up epoch each, every round runs one epoch of each loader, the order
rotating from round to round, so the machine's drift reaches all alike. Per loader: median
samples/s over the rounds; ``overhead`` = 1 - on/off (goal: <= 1%); ``aa_spread`` =
|on/on_again - 1|, what a difference of nothing looks like here. Because epoch rates on a
shared 2-core machine move by more than 1%, the record also has ``stats_us_per_batch``: the
main process's stats calls per batch timed alone (``timeit``, best of 5), to set against
``epoch_us_per_batch`` (a batch's whole cost with stats off).

Prints one JSON record per variant. Numbers only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch
from workloads.tiny import TinyDataset

import stoker

LOADERS = ("stats_on", "stats_off", "stats_on_again", "stats_on_timeline")


def _build(dataset: Any, name: str, workers: int, worker_type: str) -> Any:
    loader = stoker.DataLoader(
        dataset, batch_size=256, shuffle=True, num_workers=workers,
        persistent_workers=workers > 0, collect_stats=name != "stats_off",
        worker_type=worker_type,  # type: ignore[arg-type]
    )
    if name == "stats_on_timeline":
        loader.record_timeline()
    return loader


def _epoch_rate(loader: Any, samples: int) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return samples / (time.perf_counter() - start)


def run_variant(dataset: Any, workers: int, worker_type: str, rounds: int) -> dict[str, Any]:
    loaders = {name: _build(dataset, name, workers, worker_type) for name in LOADERS}
    for loader in loaders.values():
        _epoch_rate(loader, len(dataset))  # warm-up: workers start, tuners settle
    rates: dict[str, list[float]] = {name: [] for name in LOADERS}
    for r in range(rounds):
        order = LOADERS[r % len(LOADERS):] + LOADERS[:r % len(LOADERS)]
        for name in order:
            rates[name].append(_epoch_rate(loaders[name], len(dataset)))
    med = {name: statistics.median(v) for name, v in rates.items()}
    return {
        "workload": "stats_overhead",
        "variant": f"tiny, num_workers={workers}, worker_type={worker_type}",
        "samples_per_epoch": len(dataset), "rounds": rounds,
        "samples_per_s": {k: round(v, 1) for k, v in med.items()},
        "overhead": round(1 - med["stats_on"] / med["stats_off"], 4),
        "timeline_overhead": round(1 - med["stats_on_timeline"] / med["stats_off"], 4),
        "aa_spread": round(abs(med["stats_on"] / med["stats_on_again"] - 1), 4),
        "stats_us_per_batch": round(_stats_us_per_batch(workers > 0), 2),
        "epoch_us_per_batch": round(256 / med["stats_off"] * 1e6, 1),
        "per_round_on_over_off": [round(a / b, 4) for a, b in
                                  zip(rates["stats_on"], rates["stats_off"], strict=True)],
        "machine": {"cpus": len(__import__("os").sched_getaffinity(0)),
                    "python": platform.python_version(), "torch": torch.__version__},
    }


def _stats_us_per_batch(from_worker: bool) -> float:
    """The main process's per-batch stats calls alone, on a real batch (timeit): what
    ``collect_stats=True`` adds to each ``next()``, measured without the machine's noise."""
    import timeit

    from stoker.engine.stats import StatsAccumulator
    from stoker.workers.protocol import BatchReport

    acc = StatsAccumulator(2)
    batch = {"x": torch.zeros(256, 64), "y": torch.zeros(256, dtype=torch.long)}
    report = BatchReport(1, 0.01, 0.01, 0.001, 0.001, (), "", 0.0, True, False, 0.0)

    def one() -> None:
        entered = acc.entered_next()
        if from_worker:
            acc.worker_batch(0, report)
            acc.unpacked(entered)
        acc.left_next(entered, batch)

    calls = 20_000
    return min(timeit.repeat(one, number=calls, repeat=5)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 samples, 2 rounds")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    dataset = TinyDataset(10_000 if args.quick else 200_000)
    rounds = 2 if args.quick else args.rounds
    # "auto" runs this gather-only dataset in the calling thread even with workers (NOTE
    # [ Gathers need no workers ]); "process" forces the worker path and its per-batch reports.
    for workers, worker_type in ((0, "auto"), (2, "auto"), (2, "process")):
        print(json.dumps(run_variant(dataset, workers, worker_type, rounds)), flush=True)


if __name__ == "__main__":
    main()
