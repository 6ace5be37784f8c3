"""The one-line answer to "is my training input-bound, and why?"."""

from __future__ import annotations

import os

from stoker._core.stats import LoaderStats
from stoker.fetch.concurrency import opt_in_hint

_INPUT_BOUND = 0.10  # the loop waits for data more than this share of its time


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def summarize(s: LoaderStats) -> str:
    if s.batches == 0:
        return "stoker: no batches yet."
    total = s.wait_s + s.loop_s
    share = s.wait_s / total if total > 0 else 0.0
    rate = s.samples / total if total > 0 else 0.0
    head = (f"stoker: {s.batches} batches, {rate:,.0f} samples/s; the loop waited for data "
            f"{share:.0%} of the time")
    if s.skipped:
        head += f"; {s.skipped} samples skipped"
    device = _why_device(s, total)
    if share < _INPUT_BOUND:
        if device is not None:
            return head + ". Input-bound on the copy to the device: " + device + "."
        return head + ". Not input-bound: the training step is the bottleneck."
    if s.to_device_s > 0.5 * s.wait_s:
        return head + ". Input-bound: " + _why_queuing(s) + "."
    return head + ". Input-bound: " + _why(s, total) + "." + (
        f" Also: {device}." if device is not None else "")


def _why_device(s: LoaderStats, total: float) -> str | None:
    """With device=: the training stream waited for copies (NOTE [ Batches on the device ])."""
    waited = s.device_wait_s / total if total > 0 else 0.0
    if waited < _INPUT_BOUND or s.device_copy_s <= 0:
        return None
    rate = s.device_bytes / s.device_copy_s / 1e9
    busy = min(1.0, s.device_copy_s / total)
    per_batch = s.device_bytes / max(1, s.device_batches) / 2**20
    where = (f"the training stream waited {waited:.0%} of the time for host-to-device copies "
             f"({per_batch:,.1f} MiB a batch at {rate:,.1f} GB/s; the copy stream was busy "
             f"{busy:.0%} of the time)")
    if busy >= _BANDWIDTH_BOUND:
        return (where + ": host-to-device bandwidth is the bottleneck; send fewer bytes "
                "(uint8 images, converted to float in device_transform; decode JPEGs on the "
                "GPU with stoker.image.DecodeImages)")
    return (where + ": the copies do not overlap the step; raise device_prefetch so more are "
            "queued ahead")


def _why_queuing(s: LoaderStats) -> str:
    return (f"queuing the copies to the device takes {s.to_device_s / s.wait_s:.0%} of the "
            "time next() blocks: tensors outside stoker's page-locked slabs are copied from "
            "pageable memory, synchronously (num_workers=0, worker_type='thread', or the slabs "
            "could not be registered); use num_workers > 0, or make device_transform cheaper")


_BANDWIDTH_BOUND = 0.8  # copy stream busy this share of the loop's time: bandwidth-bound


def _why(s: LoaderStats, total: float) -> str:
    work = s.fetch_cpu_s + s.collate_s + s.pack_s
    waiting, queued = _fetch_waiting(s)
    conc = max(s.concurrency) if s.concurrency else 1
    if s.threads and conc == 1:
        # Threads wait for the GIL (held by the loop collating, or each other): that is not
        # I/O. The tuner, which raised concurrency for fetches that truly wait, already knows.
        return _why_threads(s, total)
    if waiting > 0.5 and conc == 1:
        # One fetch at a time (torch's way): threads need the user's promise of thread-safety.
        gain = 1.0 / max(1e-9, 1.0 - waiting)
        return (f"fetches wait {waiting:.0%} of their time (I/O or remote storage), one at a "
                f"time per worker as in torch; raise num_workers, or {opt_in_hint(gain)}")
    if waiting > 0.5:
        return (f"fetches wait {waiting:.0%} of their time (I/O or remote storage) at up to "
                f"{conc} concurrent fetches per worker; raise num_workers or "
                "worker_concurrency, or move the data closer")
    if s.inline:
        return ("batches are array gathers done in the training process (worker_type='auto': "
                "cheaper than receiving them from workers); the gathers themselves are the "
                "cost: use larger batches, or worker_type='process' to move them off this thread")
    if s.threads:
        return _why_threads(s, total)
    if s.num_workers == 0:
        return ("batches are loaded in the training process (num_workers=0); "
                f"set num_workers to use the machine's {_cores()} cores")
    if s.unpack_s + s.pin_s > 0.3 * s.wait_s:
        return ("the main process spends its time receiving batches (IPC/pinning); use larger "
                "batches or fewer Python objects per batch")
    steal = (f"; the hypervisor gave {s.cpu_steal_share:.0%} of this machine's CPU time to "
             "other guests (steal)" if s.cpu_steal_share >= _NOTABLE_STEAL else "")
    if queued > _OVERSUBSCRIBED:
        return (f"the {s.num_workers} workers' fetches wait {queued:.0%} of their time for a "
                f"CPU: more threads want to run than the machine's {_cores()} cores; use "
                f"num_workers <= {_cores()} or make __getitem__ cheaper" + steal)
    busy = work / (total * s.num_workers) if total > 0 else 0.0
    if s.collate_s > s.fetch_cpu_s:
        return (f"workers spend most time collating ({s.collate_s:.1f} s vs {s.fetch_cpu_s:.1f} s "
                "fetching); return tensors/arrays of one shape, or batch in __getitems__")
    if busy > 0.8 and s.num_workers < _cores():
        return (f"the {s.num_workers} workers are busy {busy:.0%} of the time on CPU work "
                f"(decode/augment); raise num_workers (this machine has {_cores()} cores)" + steal)
    return (f"the {s.num_workers} workers are CPU-bound (busy {busy:.0%}) and the machine has "
            f"{_cores()} cores; make __getitem__ cheaper (faster decoding, smaller images)"
            + steal)


def _why_threads(s: LoaderStats, total: float) -> str:
    """worker_type="thread": the fetch threads live in the training process. Their Python
    work holds its one GIL, so they are measured against one core, not ``num_workers``."""
    busy = s.fetch_cpu_s / total if total > 0 else 0.0
    return (f"batches are loaded on {s.num_workers} threads of the training process "
            f"(worker_type='thread'), which fetched on a CPU {busy:.0%} of the loop's time and "
            "collate in the loop's own thread; their Python code shares one GIL with the loop, "
            "so they cannot use more than one core: use worker_type='process' for CPU-bound "
            "datasets (decode/augment)")


_OVERSUBSCRIBED = 0.25  # fetches queued for a CPU more than this share of their wall time
_NOTABLE_STEAL = 0.10


def _fetch_waiting(s: LoaderStats) -> tuple[float, float]:
    """(share of fetch time spent waiting on anything but a CPU, share queued for a CPU).

    A fetch's wall time is its CPU time, plus time runnable but queued behind other threads
    (``fetch_queued_s``), plus time the hypervisor ran other guests (``cpu_steal_share`` of it),
    plus real waiting (I/O, sleeps, locks). Only the last is what more concurrency would use.
    """
    if s.fetch_wall_s <= 0:
        return 0.0, 0.0
    queued = min(1.0, s.fetch_queued_s / s.fetch_wall_s)
    available = max(1e-9, 1.0 - s.cpu_steal_share)
    busy = (s.fetch_cpu_s + s.fetch_queued_s) / (s.fetch_wall_s * available)
    return max(0.0, 1.0 - busy), queued
