"""The verdict and its advice, as a table of rules over measured figures.

``loader.stats()`` (``profile/verdict.py``) and ``stoker doctor`` (``doctor/diagnose.py``) both
judge with ``judge``: the first rule whose condition holds gives the kind, the reason and the
advice. Each rule is a row of ``RULES``: a condition on ``Figures`` (numbers measured by the
loader, NOTE [ Where a thread's time goes ] in ``timesplit.py``), a reason and an advice, so a
rule can be read, and tested, on its own (``tests/unit/test_verdict_rules.py`` has one test per
rule).

Two promises hold for every advice, checked in ``judge`` whatever a rule says:
- it never proposes the setting the loader already has ("use num_workers=2" to a loader with
  ``num_workers=2``): such an advice falls back to its part that is not a setting;
- it never proposes a thread opt-in (``worker_concurrency``, ``worker_type="thread"``,
  ``stoker_thread_safe``) to a dataset seen drawing from the global RNGs: that dataset breaks
  the promise those opt-ins rest on (its augmentations would depend on thread timing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stoker._core.stats import LoaderStats
from stoker.profile.timesplit import TimeSplit, fetching, gathered_here

Kind = Literal["consumer", "device_copy", "device_queuing", "gil", "contention",
               "oversubscribed", "storage", "main_thread", "transfer", "collate", "cpu"]
Mode = Literal["main", "process", "thread"]

INPUT_BOUND_SHARE = 0.10  # the loop waits for data more than this share of its time
BLOCKED_DOMINATES = 0.5  # blocked (off CPU, not queued) more than this share of fetch time
CONTENDED = 0.25  # queued for a CPU more than this share of fetch time
CPUS_FREE = 0.10  # the machine's CPU time idle at least this share: a CPU was free
BANDWIDTH_BOUND = 0.8  # copy stream busy this share of the loop's time
NOTABLE_STEAL = 0.10
GIL_BUSY = 0.6  # threads waiting while their process keeps this share of one core busy
# Threads of one process that cannot all run: on a quiet machine a GIL hand-over shows up as a
# short CPU queue, not a long sleep, so a GIL-bound dataset may be off CPU only ~30% of the time.
GIL_OFF_CPU = 0.2
RNG_REASON = "draws from a global RNG"  # the concurrency tuner's words when it sees a draw
THREAD_OPT_INS = ("worker_concurrency", "worker_type")


@dataclass(frozen=True)
class Device:
    """With ``device=``: the training stream's wait for copies, the copy stream's work."""

    wait_s: float = 0.0  # device time the training stream waited for copies
    copy_s: float = 0.0
    bytes: int = 0
    batches: int = 0
    to_device_s: float = 0.0  # CPU time in next() queuing the copies (and the transform)
    transform_s: float = 0.0  # of it, in the device_transform


@dataclass(frozen=True)
class Figures:
    """What a verdict is judged on: measured figures and how the loader ran."""

    wait_s: float
    loop_s: float
    fetch: TimeSplit  # the threads that load batches (timesplit.fetching)
    mode: Mode  # where batches are loaded: the calling thread, worker processes, threads
    num_workers: int
    cores: int
    concurrency: int = 1  # most fetches at once per worker (or threads, for mode "thread")
    fetch_cpu_s: float = 0.0  # CPU time in __getitem__ alone
    steal_share: float = 0.0  # of the machine's CPU time, given to other guests
    collate_s: float = 0.0
    pack_s: float = 0.0
    unpack_s: float = 0.0
    pin_s: float = 0.0
    inline_gathers: bool = False  # num_workers > 0 but batches gathered in the calling thread
    # most batches gathered here from the workers' starting copy (NOTE [ Gathers read the
    # workers' starting copy ]): the default for torch's classes, not inline_gathers
    copy_gathers: bool = False
    cpu_idle_share: float | None = None  # of the machine's CPU time; None: unknown
    draws_global_rng: bool | None = None  # seen drawing from random/numpy/torch's RNGs
    device: Device = field(default_factory=Device)
    current: Mapping[str, Any] = field(default_factory=dict)  # the loader's own settings

    @property
    def loop_wall_s(self) -> float:
        return self.wait_s + self.loop_s

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.loop_wall_s if self.loop_wall_s > 0 else 0.0

    @property
    def fetch_threads(self) -> int:
        """Fetches that want a CPU at once, over all processes."""
        if self.mode == "process":
            return self.num_workers * self.concurrency
        return self.concurrency

    @property
    def cpus_free(self) -> bool | None:
        return None if self.cpu_idle_share is None else self.cpu_idle_share >= CPUS_FREE

    @property
    def gil(self) -> bool:
        """Fetch threads of one process that wait while their process already keeps a core
        busy with Python (or would, if other processes left it one): they wait for each
        other (the GIL), not for storage. Inferred: CPython does not count GIL waits."""
        per_process = self.concurrency
        f = self.fetch
        off_cpu = 1 - f.cpu_share if f.wall_s > 0 else 0.0
        if per_process < 2 or off_cpu < GIL_OFF_CPU or self.loop_wall_s <= 0:
            return False
        processes = self.num_workers if self.mode == "process" else 1
        # CPU used, plus time runnable but queued: on a busy machine the GIL holder waits for
        # a CPU too, and threads handing the GIL over wake and queue (Linux counts them);
        # threads waiting on storage sleep in a system call, neither running nor queued.
        busy = (self.fetch_cpu_s + f.queued_s + self.collate_s + self.pack_s) / (
            self.loop_wall_s * max(1, processes))
        return busy >= GIL_BUSY

    @property
    def device_waited(self) -> float:
        return self.device.wait_s / self.loop_wall_s if self.loop_wall_s > 0 else 0.0

    @property
    def steal_note(self) -> str:
        share = self.steal_share
        return (f"; the hypervisor gave {share:.0%} of this machine's CPU time to other "
                "guests (steal)" if share >= NOTABLE_STEAL else "")


@dataclass(frozen=True)
class Advice:
    """What to change. ``settings``: the loader arguments it proposes (checked against the
    current ones); ``otherwise``: what it says when those are the current ones already;
    ``opt_in``: it rests on the promise of a thread-safe ``__getitem__``."""

    text: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    otherwise: str = ""
    opt_in: bool = False


@dataclass(frozen=True)
class Rule:
    name: str
    kind: Kind
    when: Callable[[Figures], bool]
    reason: Callable[[Figures], str]
    advice: Callable[[Figures], Advice]


@dataclass(frozen=True)
class Verdict:
    rule: str
    kind: Kind
    input_bound: bool
    reason: str  # why, one or two sentences
    advice: Advice


def judge(f: Figures) -> Verdict:
    for rule in RULES:
        if rule.when(f):
            advice = _kept_promises(rule.advice(f), f)
            return Verdict(rule.name, rule.kind, rule.kind != "consumer", rule.reason(f),
                           advice)
    raise AssertionError("the last rule always holds")  # pragma: no cover


def _kept_promises(advice: Advice, f: Figures) -> Advice:
    repeats = bool(advice.settings) and all(
        f.current.get(k, _DEFAULTS.get(k)) == v for k, v in advice.settings.items())
    breaks = f.draws_global_rng is True and (advice.opt_in or any(
        k in THREAD_OPT_INS for k in advice.settings))
    if repeats or breaks:
        return Advice(advice.otherwise)
    return advice


_DEFAULTS: dict[str, Any] = {"num_workers": 0, "worker_type": "auto",
                             "worker_concurrency": "auto"}


# -- the rules, in the order they are tried ------------------------------------------------------


def _device_copy(f: Figures) -> bool:
    return f.wait_share < INPUT_BOUND_SHARE and f.device_waited >= INPUT_BOUND_SHARE and (
        f.device.copy_s > 0)


def _device_copy_reason(f: Figures) -> str:
    d = f.device
    rate = d.bytes / d.copy_s / 1e9
    busy = min(1.0, d.copy_s / f.loop_wall_s)
    per_batch = d.bytes / max(1, d.batches) / 2**20
    return (f"the training stream waited {f.device_waited:.0%} of the time for host-to-device "
            f"copies ({per_batch:,.1f} MiB a batch at {rate:,.1f} GB/s; the copy stream was "
            f"busy {busy:.0%} of the time)")


def _device_copy_advice(f: Figures) -> Advice:
    if min(1.0, f.device.copy_s / f.loop_wall_s) >= BANDWIDTH_BOUND:
        return Advice("host-to-device bandwidth is the bottleneck; send fewer bytes (uint8 "
                      "images, converted to float in device_transform; decode JPEGs on the GPU "
                      "with stoker.image.DecodeImages)")
    return Advice("the copies do not overlap the step; raise device_prefetch so more are "
                  "queued ahead")


def _consumer_advice(f: Figures) -> Advice:
    return Advice("nothing in the loader will make training faster")


def _transform_bound(f: Figures) -> bool:
    return f.device.transform_s > 0.5 * f.device.to_device_s


def _device_queuing_reason(f: Figures) -> str:
    d = f.device
    if _transform_bound(f):
        return (f"the device_transform takes {d.transform_s / f.wait_s:.0%} of the time "
                "next() blocks (it runs on the training thread, before each batch is handed "
                "out)")
    return (f"queuing the copies to the device takes {d.to_device_s / f.wait_s:.0%} "
            "of the time next() blocks: tensors outside stoker's page-locked slabs are copied "
            "from pageable memory, synchronously (num_workers=0, worker_type='thread', or the "
            "slabs could not be registered)")


def _device_queuing_advice(f: Figures) -> Advice:
    if _transform_bound(f):
        return Advice("make device_transform cheaper; a GPU decode (stoker.image.DecodeImages) "
                      "there costs the training thread's time: where the CPU cores keep up, "
                      "decode in the workers with stoker's image path instead "
                      "(docs/gpu_feed.md, \"Which decode\")")
    return Advice("use num_workers > 0, or make device_transform cheaper",
                  otherwise="make device_transform cheaper")


def _gil_reason(f: Figures) -> str:
    return (f"the fetch threads spend {1 - f.fetch.cpu_share:.0%} of their time off a CPU "
            "while their process keeps a core busy with Python (or waits for one): they wait "
            "for the GIL, not storage (inferred: CPython does not count GIL waits)")


def _threads_reason(f: Figures) -> str:
    return ("batches are loaded on threads of the training process (worker_type='thread'), "
            f"on a CPU {f.fetch.cpu_s / f.loop_wall_s:.0%} of the loop's time; their Python "
            "code shares one GIL with the loop, so they cannot use more than one core")


def _gil_advice(f: Figures) -> Advice:
    return Advice(f"use processes: worker_type=\"process\", num_workers={f.cores}",
                  {"worker_type": "process", "num_workers": f.cores},
                  otherwise="make __getitem__ cheaper")


def _oversubscribed(f: Figures) -> bool:
    return f.fetch.queued_share > CONTENDED and f.fetch_threads > f.cores


def _oversubscribed_reason(f: Figures) -> str:
    return (f"{f.fetch.who} wait {f.fetch.queued_share:.0%} of their time for a CPU: "
            f"{f.fetch_threads} fetches want to run at once on the machine's {f.cores} cores"
            + f.steal_note)


def _oversubscribed_advice(f: Figures) -> Advice:
    if f.mode == "process" and f.num_workers > f.cores:
        return Advice(f"use num_workers={f.cores}, or make __getitem__ cheaper",
                      {"num_workers": f.cores}, otherwise="make __getitem__ cheaper")
    return Advice("run fewer fetches at once (worker_concurrency), or make __getitem__ "
                  "cheaper", otherwise="make __getitem__ cheaper")


def _contention(f: Figures) -> bool:
    if f.fetch.queued_share > CONTENDED:
        return True
    # Without a queue to read, waiting off the CPU on a machine with no CPU free could be
    # either: too busy to tell.
    return (not f.fetch.queue_measured and f.fetch.blocked_share > BLOCKED_DOMINATES
            and f.cpus_free is False)


def _contention_reason(f: Figures) -> str:
    if f.fetch.queue_measured:
        return (f"{f.fetch.who} wait {f.fetch.queued_share:.0%} of their time for a CPU "
                f"(CPU contention: the {f.cores} cores were held by other processes, or by the "
                f"training thread beside {f.fetch_threads} fetch(es) of ours); the machine is "
                "too busy to tell what the loader needs" + f.steal_note)
    idle = f.cpu_idle_share or 0.0
    return (f"{f.fetch.who} spend {f.fetch.blocked_share:.0%} of their time off a CPU while "
            f"the machine's CPUs were {1 - idle:.0%} busy, and this system does not say how "
            "much of that was waiting for a CPU: the machine is too busy to tell")


def _contention_advice(f: Figures) -> Advice:
    return Advice("run again when other processes leave the CPUs free; no loader setting can "
                  "be judged meanwhile")


def _storage(f: Figures) -> bool:
    """Blocked time dominates, and it is not a CPU queue in disguise: the queue was measured
    (blocked is then what is left), or a CPU was free (or nothing says it was not)."""
    return f.fetch.blocked_share > BLOCKED_DOMINATES and (
        f.fetch.queue_measured or f.cpus_free is not False)


def _storage_reason(f: Figures) -> str:
    at = ("one at a time per worker as in torch" if f.concurrency == 1
          else f"at up to {f.concurrency} concurrent fetches")
    if f.mode == "main":
        at = "in the training thread"
    return (f"{f.fetch.who} are blocked off a CPU {f.fetch.blocked_share:.0%} of their time "
            f"(I/O, remote storage or sleeps in __getitem__), {at}; "
            f"{f.fetch.queued_share:.0%} waiting for a CPU")


def _storage_advice(f: Figures) -> Advice:
    more = max(2 * f.cores, 2 * f.num_workers, 4)
    if f.draws_global_rng:
        return Advice(f"run more fetches at once: num_workers={more} (threads inside a worker "
                      "are out: __getitem__ draws from the global RNGs, so it is not "
                      "thread-safe in stoker's sense)", {"num_workers": more})
    if f.concurrency == 1:
        gain = 1.0 / max(1e-9, 1.0 - f.fetch.blocked_share)
        from stoker.fetch.concurrency import opt_in_hint

        return Advice(f"raise num_workers (num_workers={more}), or {opt_in_hint(gain)}",
                      {"num_workers": more}, opt_in=True, otherwise="move the data closer")
    return Advice(f"raise num_workers (num_workers={more}) or worker_concurrency, or move the "
                  "data closer", {"num_workers": more}, opt_in=True,
                  otherwise="move the data closer")


def _main_thread(f: Figures) -> bool:
    return f.mode == "main"


def _main_thread_reason(f: Figures) -> str:
    if f.copy_gathers:
        return ("batches of torch's dataset classes are gathered in the training process "
                "from the copy the workers started with (cheaper than receiving them from "
                "workers); the gathers themselves are the cost")
    if f.inline_gathers:
        return ("batches are array gathers done in the training process (cheaper than "
                "receiving them from workers); the gathers themselves are the cost")
    return "batches are loaded in the training process itself (num_workers=0)"


def _main_thread_advice(f: Figures) -> Advice:
    if f.copy_gathers:
        return Advice("use larger batches (a batch costs one gather per tensor)")
    if f.inline_gathers:
        return Advice("use larger batches, or worker_type=\"process\" to move them off this "
                      "thread", {"worker_type": "process"}, otherwise="use larger batches")
    return Advice(f"load in worker processes: num_workers={f.cores} (this machine has "
                  f"{f.cores} cores)", {"num_workers": f.cores})


def _transfer(f: Figures) -> bool:
    return (f.unpack_s + f.pin_s > 0.3 * f.wait_s
            or f.pack_s > 0.5 * (f.fetch_cpu_s + f.collate_s))


def _transfer_reason(f: Figures) -> str:
    return (f"moving batches from the workers to the main process is the cost (pack "
            f"{f.pack_s:.2f} s, receive {f.unpack_s:.2f} s, pin {f.pin_s:.2f} s)")


def _transfer_advice(f: Figures) -> Advice:
    plain = ("use larger batches, or fewer Python objects per batch (tensors/arrays instead "
             "of lists of numbers or strings)")
    if f.mode != "process" or "slab_transport" in f.current.get("beyond_torch", ()):
        return Advice(plain)
    return Advice(
        plain + "; or beyond_torch={'slab_transport'}: batches collated straight into reused "
        "shared-memory slabs, one descriptor sent per batch (beyond torch: is_shared() is "
        "False, a view of a larger tensor arrives compact, leaves that alias arrive as "
        "separate tensors)", {"beyond_torch": {"slab_transport"}}, otherwise=plain)


def _collate(f: Figures) -> bool:
    return f.collate_s > f.fetch_cpu_s


def _collate_reason(f: Figures) -> str:
    return (f"the workers spend more time collating ({f.collate_s:.2f} s) than fetching "
            f"({f.fetch_cpu_s:.2f} s)")


def _collate_advice(f: Figures) -> Advice:
    return Advice("return tensors/arrays of one shape from __getitem__ (not lists or many "
                  "small objects), or build the whole batch in __getitems__")


def _cpu_reason(f: Figures) -> str:
    busy = f.fetch_cpu_s / (f.loop_wall_s * max(1, f.num_workers)) if f.loop_wall_s else 0.0
    return (f"the {f.num_workers} worker(s) are busy on CPU work in __getitem__ (decode, "
            f"augment): on a CPU {busy:.0%} of the time" + f.steal_note)


def _cpu_advice(f: Figures) -> Advice:
    if f.num_workers < f.cores:
        return Advice(f"use all {f.cores} cores (num_workers={f.cores}), then make "
                      "__getitem__ cheaper", {"num_workers": f.cores},
                      otherwise="make __getitem__ cheaper")
    return Advice(f"make __getitem__ cheaper (faster decoding, smaller images): the "
                  f"{f.num_workers} workers already use the machine's {f.cores} cores")


RULES: tuple[Rule, ...] = (
    Rule("device_copy", "device_copy", _device_copy, _device_copy_reason, _device_copy_advice),
    Rule("consumer", "consumer", lambda f: f.wait_share < INPUT_BOUND_SHARE,
         lambda f: "the training step is the bottleneck", _consumer_advice),
    Rule("device_queuing", "device_queuing", lambda f: f.device.to_device_s > 0.5 * f.wait_s,
         _device_queuing_reason, _device_queuing_advice),
    Rule("gil", "gil", lambda f: f.gil, _gil_reason, _gil_advice),
    Rule("storage", "storage", _storage, _storage_reason, _storage_advice),
    Rule("oversubscribed", "oversubscribed", _oversubscribed, _oversubscribed_reason,
         _oversubscribed_advice),
    Rule("contention", "contention", _contention, _contention_reason, _contention_advice),
    Rule("threads", "gil", lambda f: f.mode == "thread", _threads_reason, _gil_advice),
    Rule("main_thread", "main_thread", _main_thread, _main_thread_reason, _main_thread_advice),
    Rule("transfer", "transfer", _transfer, _transfer_reason, _transfer_advice),
    Rule("collate", "collate", _collate, _collate_reason, _collate_advice),
    Rule("cpu", "cpu", lambda f: True, _cpu_reason, _cpu_advice),
)


def from_stats(s: LoaderStats, cores: int, worker_type: str = "auto",
               draws_global_rng: bool | None = None) -> Figures:
    """The figures of ``loader.stats()`` (or the doctor's run of it). ``worker_type`` as the
    loader was built; a dataset the concurrency tuner saw drawing from a global RNG counts
    as drawing even when the caller did not look."""
    copy_gathers = gathered_here(s)
    if s.threads or worker_type == "thread":
        mode: Mode = "thread"
    elif s.num_workers == 0 or s.inline or copy_gathers:
        mode = "main"
    else:
        mode = "process"
    conc = max(s.concurrency or (1,))
    if mode == "thread":
        conc *= max(1, s.num_workers)
    if any(RNG_REASON in e.reason for e in s.tuner):
        draws_global_rng = True
    return Figures(
        wait_s=s.wait_s, loop_s=s.loop_s, fetch=fetching(s), mode=mode,
        num_workers=s.num_workers, cores=cores, concurrency=conc, fetch_cpu_s=s.fetch_cpu_s,
        collate_s=s.collate_s, steal_share=s.cpu_steal_share,
        pack_s=s.pack_s, unpack_s=s.unpack_s, pin_s=s.pin_s, inline_gathers=s.inline,
        copy_gathers=copy_gathers, cpu_idle_share=s.cpu_idle_share,
        draws_global_rng=draws_global_rng,
        device=Device(s.device_wait_s, s.device_copy_s, s.device_bytes, s.device_batches,
                      s.to_device_s, s.device_transform_s),
        current={"num_workers": s.num_workers, "worker_type": worker_type,
                 "beyond_torch": s.beyond_torch},
    )


def judge_device(f: Figures) -> str:
    """The copy to the device, worded on its own (a second finding beside another verdict)."""
    return _device_copy_reason(f) + ": " + _device_copy_advice(f).text
