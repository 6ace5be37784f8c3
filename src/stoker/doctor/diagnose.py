"""Where the time goes and what holds the loop back, from one run's figures (no I/O: unit
tests feed it recorded stats).

The main loop's wall time is split into the training step (``loop_s``, the consumer) and
``next()`` (``wait_s``: waiting for a batch, receiving it from a worker, pinning it). The
loader's work is seconds summed over the threads that load batches (the workers' fetches, or
the training thread's ``next()`` without workers), each split into blocked (storage, network,
sleeps, locks), waiting for a free CPU, CPU, collate and packing (NOTE [ Where a thread's time
goes ] in ``profile/timesplit.py``). The verdict and its advice come from the rule table
``profile/rules.py``, the one ``loader.stats()`` judges with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stoker._core.stats import LoaderStats
from stoker.profile.rules import Kind, Verdict, from_stats, judge
from stoker.profile.timesplit import fetching, loads_in_calling_thread

__all__ = ["Diagnosis", "Kind", "Setup", "Share", "diagnose"]


@dataclass(frozen=True)
class Share:
    name: str
    seconds: float
    of: Literal["loop", "work"]  # share of the loop's wall time, or of the loader's work


@dataclass(frozen=True)
class Setup:
    """How the measured loader ran."""

    num_workers: int
    worker_type: str  # "auto", "process" or "thread"
    cores: int
    device_copy: bool = False  # the loop also copies batches to an accelerator


@dataclass(frozen=True)
class Diagnosis:
    kind: Kind
    wait_share: float
    headline: str
    advice: str
    shares: tuple[Share, ...]
    verdict: Verdict | None = None

    @property
    def input_bound(self) -> bool:
        return self.kind != "consumer"


def diagnose(s: LoaderStats, setup: Setup, draws_global_rng: bool | None = None) -> Diagnosis:
    figures = from_stats(s, setup.cores, setup.worker_type, draws_global_rng)
    v = judge(figures)
    waited = f"the training loop waited for data {figures.wait_share:.0%} of the time"
    if v.kind == "consumer":
        head = f"Not input-bound: {waited}; the training step is the bottleneck."
    else:
        head = f"Input-bound: {waited}. {_sentence(v.reason)}"
    return Diagnosis(v.kind, figures.wait_share, head, _sentence(v.advice.text),
                     _shares(s, figures.gil), v)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _shares(s: LoaderStats, gil: bool) -> tuple[Share, ...]:
    split = fetching(s)  # the training thread's next() also collates: its CPU includes that
    cpu = (max(0.0, split.cpu_s - s.collate_s) if loads_in_calling_thread(s)
           else split.cpu_s)
    receive = s.unpack_s + s.pin_s + s.to_device_s
    return (
        Share("training step (the consumer)", s.loop_s, "loop"),
        Share("waiting in next() for a batch", max(0.0, s.wait_s - receive), "loop"),
        Share("receiving batches from workers", s.unpack_s, "loop"),
        Share("pin_memory", s.pin_s, "loop"),
        Share("queuing host-to-device copies (device=)",
              max(0.0, s.to_device_s - s.device_transform_s), "loop"),
        Share("device_transform (device=)", s.device_transform_s, "loop"),
        Share("blocked: GIL (inferred), fetch threads waiting for each other" if gil
              else "blocked: storage / sleeps / locks in __getitem__", split.blocked_s, "work"),
        Share("waiting for a free CPU (queued)", split.queued_s, "work"),
        Share("CPU in __getitem__", cpu, "work"),
        Share("collate", s.collate_s, "work"),
        Share("packing batches for the main process", s.pack_s, "work"),
    )
