"""Where the time goes and what holds the loop back, from one run's figures (no I/O: unit
tests feed it recorded stats).

The main loop's wall time is split into the training step (``loop_s``, the consumer) and
``next()`` (``wait_s``: waiting for a batch, receiving it from a worker, pinning it). The
loader's work is CPU-seconds summed over its workers (or the training thread without
workers): real waiting (storage, network, sleeps, locks), waiting for a CPU, the GIL, CPU in
``__getitem__``, collate, and packing the batch into shared memory for the main process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stoker._core.stats import LoaderStats

Kind = Literal["consumer", "main_thread", "gil", "storage", "transfer", "oversubscribed",
               "collate", "cpu"]
INPUT_BOUND_SHARE = 0.10  # the loop waits for data more than this share of its time (verdict.py)
_WAITING = 0.5  # fetches wait (off CPU) more than this share of their wall time
_GIL_BUSY = 0.6  # ...while their process keeps at least this share of one core busy
_OVERSUBSCRIBED = 0.25
# Threads of one process that cannot all run: on a quiet machine a GIL hand-over shows up as a
# short CPU queue, not a long sleep, so a GIL-bound dataset may be off CPU only ~30% of the time.
_GIL_OFF_CPU = 0.2


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

    @property
    def input_bound(self) -> bool:
        return self.kind != "consumer"


def diagnose(s: LoaderStats, setup: Setup) -> Diagnosis:
    loop_wall = s.wait_s + s.loop_s
    wait_share = s.wait_s / loop_wall if loop_wall > 0 else 0.0
    waiting, queued = _fetch_split(s)
    gil = _gil_bound(s, setup, loop_wall)
    shares = _shares(s, gil)
    kind = _kind(s, setup, wait_share, waiting, queued, gil)
    head, advice = _words(kind, s, setup, wait_share, waiting, queued)
    return Diagnosis(kind, wait_share, head, advice, shares)


def _fetch_split(s: LoaderStats) -> tuple[float, float]:
    """(share of fetch wall time off CPU for reasons other than a CPU queue or steal, share
    queued for a CPU); as in profile/verdict.py."""
    if s.fetch_wall_s <= 0:
        return 0.0, 0.0
    queued = min(1.0, s.fetch_queued_s / s.fetch_wall_s)
    available = max(1e-9, 1.0 - s.cpu_steal_share)
    busy = (s.fetch_cpu_s + s.fetch_queued_s) / (s.fetch_wall_s * available)
    return max(0.0, 1.0 - busy), queued


def threads_per_process(s: LoaderStats, setup: Setup) -> int:
    if setup.worker_type == "thread":
        return max(1, setup.num_workers) * max(s.concurrency or (1,))
    return max(s.concurrency or (1,))


def _gil_bound(s: LoaderStats, setup: Setup, loop_wall: float) -> bool:
    """Fetch threads that wait while their process already keeps a core busy with Python
    (or would, if other processes left it one):
    they wait for each other (the GIL), not for storage."""
    off_cpu = 1 - s.fetch_cpu_s / s.fetch_wall_s if s.fetch_wall_s > 0 else 0.0
    if threads_per_process(s, setup) < 2 or off_cpu < _GIL_OFF_CPU or loop_wall <= 0:
        return False
    processes = 1 if setup.worker_type == "thread" or s.num_workers == 0 else s.num_workers
    # CPU used, plus time runnable but queued: on a busy machine the GIL holder waits for a
    # CPU too, and threads handing the GIL over wake and queue (Linux counts them); threads
    # waiting on storage sleep in a system call, neither running nor queued.
    busy = (s.fetch_cpu_s + s.fetch_queued_s + s.collate_s + s.pack_s) / (loop_wall * processes)
    return busy >= _GIL_BUSY


def _shares(s: LoaderStats, gil: bool) -> tuple[Share, ...]:
    off_cpu = max(0.0, s.fetch_wall_s * (1 - s.cpu_steal_share) - s.fetch_cpu_s
                  - s.fetch_queued_s)
    receive = s.unpack_s + s.pin_s + s.to_device_s
    rows = [
        Share("training step (the consumer)", s.loop_s, "loop"),
        Share("waiting in next() for a batch", max(0.0, s.wait_s - receive), "loop"),
        Share("receiving batches from workers", s.unpack_s, "loop"),
        Share("pin_memory", s.pin_s, "loop"),
        Share("queuing host-to-device copies (device=)", s.to_device_s, "loop"),
        Share("GIL: fetch threads waiting for each other" if gil
              else "storage / other waits in __getitem__", off_cpu, "work"),
        Share("waiting for a free CPU", s.fetch_queued_s, "work"),
        Share("CPU in __getitem__", s.fetch_cpu_s, "work"),
        Share("collate", s.collate_s, "work"),
        Share("packing batches for the main process", s.pack_s, "work"),
    ]
    return tuple(rows)


def _kind(s: LoaderStats, setup: Setup, wait_share: float, waiting: float, queued: float,
          gil: bool) -> Kind:
    if wait_share < INPUT_BOUND_SHARE:
        return "consumer"
    if gil:
        return "gil"
    if waiting > _WAITING:
        return "storage"
    if (s.num_workers == 0 or s.inline) and setup.worker_type != "thread":
        return "main_thread"
    if s.unpack_s + s.pin_s > 0.3 * s.wait_s or s.pack_s > 0.5 * (s.fetch_cpu_s + s.collate_s):
        return "transfer"
    if s.collate_s > s.fetch_cpu_s:
        return "collate"
    # Queued for a CPU is only the loader's own doing when it runs more threads than cores;
    # otherwise other processes hold the CPUs (the report says how busy the machine was).
    if queued > _OVERSUBSCRIBED and _fetch_threads(s, setup) > setup.cores:
        return "oversubscribed"
    return "cpu"


def _fetch_threads(s: LoaderStats, setup: Setup) -> int:
    if setup.worker_type == "thread" or s.num_workers == 0:
        return threads_per_process(s, setup)
    return s.num_workers * threads_per_process(s, setup)


def _words(kind: Kind, s: LoaderStats, setup: Setup, wait_share: float, waiting: float,
           queued: float) -> tuple[str, str]:
    waited = f"the training loop waited for data {wait_share:.0%} of the time"
    n, cores = s.num_workers, setup.cores
    if kind == "consumer":
        return (f"Not input-bound: {waited}; the training step is the bottleneck.",
                "Nothing in the loader will make training faster; fewer workers would free "
                "CPU and memory for the step.")
    head = f"Input-bound: {waited}."
    if kind == "gil":
        off_cpu = 1 - s.fetch_cpu_s / s.fetch_wall_s if s.fetch_wall_s > 0 else 0.0
        return (head + f" The fetch threads spend {off_cpu:.0%} of their time off the CPU "
                "while their process keeps a core busy with Python (or waits for one): they "
                "wait for the GIL, not storage.",
                f"Use processes: worker_type=\"process\", num_workers={cores}.")
    if kind == "storage":
        return (head + f" Fetches wait {waiting:.0%} of their time off the CPU (storage, "
                "network or sleeps in __getitem__).",
                "Run more fetches at once: more workers than cores, or threads inside each "
                "worker (worker_concurrency, if __getitem__ is thread-safe).")
    if kind == "main_thread":
        return (head + " Batches are loaded in the training process itself (no workers).",
                f"Load in worker processes: num_workers={cores} (this machine has {cores} "
                "cores).")
    if kind == "transfer":
        return (head + " Moving batches from the workers to the main process is the cost "
                f"(pack {s.pack_s:.2f} s, receive {s.unpack_s:.2f} s, pin {s.pin_s:.2f} s).",
                "Use larger batches, or fewer Python objects per batch (tensors/arrays "
                "instead of lists of numbers or strings).")
    if kind == "oversubscribed":
        return (head + f" The fetches wait {queued:.0%} of their time for a CPU: more "
                f"threads want to run than the {cores} cores.",
                f"Use num_workers <= {cores}, or make __getitem__ cheaper.")
    if kind == "collate":
        return (head + f" The workers spend more time collating ({s.collate_s:.2f} s) than "
                f"fetching ({s.fetch_cpu_s:.2f} s).",
                "Return tensors/arrays of one shape from __getitem__ (not lists or many "
                "small objects), or build the whole batch in __getitems__; more workers "
                f"help up to the {cores} cores.")
    return (head + f" The {n} worker(s) are busy on CPU work in __getitem__ (decode, "
            "augment).",
            f"Use all {cores} cores (num_workers={cores}), then make __getitem__ cheaper.")
