"""What a checkpoint costs: ``state_dict()`` per call, and resuming in the middle of an epoch.

    .venv/bin/python benchmarks/resume_cost.py                  # 1,000,000 samples
    .venv/bin/python benchmarks/resume_cost.py --num-samples 100000

Map-style dataset of ``num_samples`` ints, ``shuffle=True`` with a seeded generator,
``batch_size=32``, ``num_workers=0``. The loader is run to the middle of the epoch (not
timed), then:

* ``state_dict_us``: ``timeit`` of ``loader.state_dict()`` there, µs per call (median of 5
  repeats). ``state_dict_json_bytes``: its size as JSON. ``state_dict_us_global_rng``: the same
  with ``generator=None`` (the state then also carries torch's global RNG, read at each call).
* ``resume_s``: a new loader, ``load_state_dict(state)``, ``iter()``, ``next()``: seconds to the
  first batch after the save (median of ``repeats``). The resume recomputes the epoch's order
  from the saved generator state and skips the delivered batches without fetching them.
* ``fresh_start_s``: the same for a loader starting the epoch from scratch, for scale.
* ``resumed_first_index_ok``: the resumed first batch is the batch the uninterrupted run yields
  there.

Prints one JSON record. Numbers only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import timeit
from typing import Any

import torch
from torch.utils.data import Dataset

import stoker

BATCH_SIZE = 32


class Ints(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _loader(num_samples: int, seeded: bool = True) -> stoker.DataLoader:
    return stoker.DataLoader(
        Ints(num_samples), batch_size=BATCH_SIZE, shuffle=True,
        generator=torch.Generator().manual_seed(0) if seeded else None,
    )


def _time_to_first_batch(loader: Any, state: dict[str, Any] | None) -> tuple[float, Any]:
    start = time.perf_counter()
    if state is not None:
        loader.load_state_dict(state)
    batch = next(iter(loader))
    return time.perf_counter() - start, batch


def _state_dict_us(
    num_samples: int, state: dict[str, Any] | None, calls: int, seeded: bool
) -> float:
    """``state_dict()`` on a loader parked after a delivered batch (at ``state``, or the start)."""
    parked = _loader(num_samples, seeded)
    if state is not None:
        parked.load_state_dict(state)
    it = iter(parked)
    next(it)
    repeats = timeit.repeat(parked.state_dict, number=calls, repeat=5)
    del it
    return statistics.median(repeats) / calls * 1e6


def measure(
    num_samples: int = 1_000_000, state_calls: int = 10_000, repeats: int = 3
) -> dict[str, Any]:
    loader = _loader(num_samples)
    middle = (num_samples // BATCH_SIZE) // 2
    it = iter(loader)
    for _ in range(middle):
        next(it)
    state = loader.state_dict()
    expected = next(it)  # what the uninterrupted run yields after the save
    del it
    state_us = _state_dict_us(num_samples, state, state_calls, seeded=True)
    global_us = _state_dict_us(num_samples, None, state_calls, seeded=False)
    resumes, fresh = [], []
    ok = True
    for _ in range(repeats):
        seconds, got = _time_to_first_batch(_loader(num_samples), state)
        resumes.append(seconds)
        ok = ok and bool(torch.equal(got, expected))
        fresh.append(_time_to_first_batch(_loader(num_samples), None)[0])
    return {
        "workload": "resume_cost",
        "num_samples": num_samples,
        "batch_size": BATCH_SIZE,
        "resumed_at_batch": middle,
        "state_dict_us": round(state_us, 2),
        "state_dict_us_global_rng": round(global_us, 2),
        "state_dict_json_bytes": len(json.dumps(state)),
        "resume_s": round(statistics.median(resumes), 4),
        "fresh_start_s": round(statistics.median(fresh), 4),
        "resumed_first_index_ok": ok,
        "machine": {"python": platform.python_version(), "torch": torch.__version__},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=1_000_000)
    parser.add_argument("--state-calls", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(measure(args.num_samples, args.state_calls, args.repeats)))


if __name__ == "__main__":
    main()
