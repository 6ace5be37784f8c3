"""What the user has received so far in an epoch: the loader's resumable state.

NOTE [ Resume state ]
The state is always that of the last batch handed to the user, never of what is prefetched.
It is small and plain (ints, strings, lists): the epoch's starting generator states (base64),
the base seed, how many batches of the epoch were delivered as a contiguous prefix, and the
positions delivered beyond it (only with ``in_order=False``). Resuming recomputes the epoch's
index order from the generator states, skips the delivered positions without fetching them
and continues; per-batch seeds depend only on (base seed, epoch, position), so augmentations
come out the same whatever ``num_workers`` was before or after. Under torch's per-worker
seeding each worker's own RNG states are kept as well, and the state resumes only with the same
``num_workers`` (NOTE [ Worker streams resume ] in ``engine.worker_streams``); with
``num_workers=0``, the main process's global RNG states at the epoch start and at the save point
(NOTE [ Main streams resume ] in ``sampling.rng_state``). ``state_dict()``
copies a few fields: microseconds, no worker round trip (but for one case that note names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATE_FORMAT = "stoker.DataLoader/1"


@dataclass
class EpochProgress:
    rng: Any  # RngSnapshot of the epoch start; encoded lazily
    base_seed: int
    drew_base_seed: bool
    epoch: int  # epochs this iterator has begun before this one (persistent workers)
    iterations: int  # epochs this loader has begun before this one
    kind: str
    num_workers: int
    prefix: int = 0
    extras: set[int] = field(default_factory=set)
    finished: bool = False
    sampler_state: Any = None
    sampler_epoch: int | None = None
    live_sampler: Any = None  # a delivery-tracked sampler: its state_dict() is read live
    # An IterableDataset read by workers: batches delivered from each worker's stream. Its
    # task positions depend on when an ended worker's reply is read, its streams do not.
    worker_batches: list[int] | None = None
    # Each worker's own streams (NOTE [ Worker streams resume ] in ``engine.worker_streams``);
    # None without worker processes.
    streams: Any = None
    # Whether the epoch had drawn from its sampler (a RandomSampler without a generator draws
    # its seed from torch's global RNG at its first next()): a resume draws there before the
    # save point is put back, else after it (``BaseIterator._skip_delivered``).
    sampler_started: bool = False

    def delivered(self, position: int, sampler_state: Any = None, worker: int | None = None,
                  rngs: Any = None) -> None:
        if worker is not None and self.worker_batches is not None:
            self.worker_batches[worker] += 1
        if rngs is not None and worker is not None:
            self.streams.delivered(worker, rngs)
        if position == self.prefix:
            self.prefix += 1
            while self.prefix in self.extras:
                self.extras.discard(self.prefix)
                self.prefix += 1
            if sampler_state is not None:
                self.sampler_state = sampler_state
        else:
            self.extras.add(position)

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "iterations": self.iterations,
            "epoch": self.epoch,
            "batches": self.prefix,
            "extra_batches": sorted(self.extras),
            "finished": self.finished,
            "base_seed": self.base_seed,
            "drew_base_seed": self.drew_base_seed,
            "rng": self.rng.encoded_with_save_point(),
            "sampler_state": (
                self.live_sampler.state_dict() if self.live_sampler is not None
                else self.sampler_state
            ),
            "sampler_epoch": self.sampler_epoch,
            "sampler_started": self.sampler_started,
            "dataset_kind": self.kind,
            "num_workers": self.num_workers,
            "worker_batches": (
                list(self.worker_batches) if self.worker_batches is not None else None
            ),
        }


def check_state(sd: Any) -> dict[str, Any]:
    """Validate a state dict before it is applied; errors say what is wrong and what to do."""
    if not isinstance(sd, dict):
        raise TypeError(
            f"load_state_dict expects the dict returned by DataLoader.state_dict(), "
            f"got {type(sd).__name__}."
        )
    if sd.get("format") != STATE_FORMAT:
        raise ValueError(
            f"load_state_dict got a state of format {sd.get('format')!r}, expected "
            f"{STATE_FORMAT!r}: pass the dict returned by stoker's DataLoader.state_dict() "
            "(a torchdata StatefulDataLoader state cannot be loaded)."
        )
    return sd
