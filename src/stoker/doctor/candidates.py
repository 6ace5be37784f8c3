"""The settings worth trying on the user's dataset, for a verdict.

Every candidate is a small set of constructor arguments changed from the user's own. Ones
that rest on a promise about the user's code (threads inside a worker need a thread-safe
``__getitem__``) are marked opt-in, and the report says what the promise is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stoker.doctor.diagnose import Kind

THREAD_SAFE_PROMISE = ("opt-in: only if your __getitem__ is thread-safe and draws randomness "
                       "only from stoker.sample_rng()")
BEYOND_TORCH_PROMISE = ("opt-in: beyond torch's behaviour (per-batch seeding, no workers for "
                        "plain gathers, stragglers moved, batches in slabs, ...): "
                        "docs/same_as_torch.md")
SLABS_PROMISE = ("opt-in: beyond torch's behaviour: batches from workers in reused shared-"
                 "memory slabs (is_shared() False, views arrive compact, aliasing leaves "
                 "arrive as separate tensors): docs/same_as_torch.md")


@dataclass(frozen=True)
class Candidate:
    overrides: Mapping[str, Any]
    opt_in: str = ""  # the promise this setting needs from the user's code, if any
    label: str = field(default="")

    def name(self) -> str:
        return self.label or ", ".join(f"{k}={v!r}" for k, v in self.overrides.items())


def candidates(kwargs: Mapping[str, Any], kind: Kind, cores: int, cuda: bool,
               limit: int = 7, draws_global_rng: bool | None = None) -> list[Candidate]:
    """Distinct settings, the likeliest for ``kind`` first, at most ``limit``. A dataset
    seen drawing from the global RNGs (``rng_probe.py``) breaks the thread opt-ins' promise:
    none of them is tried."""
    base_n = int(kwargs.get("num_workers", 0))
    threads = kwargs.get("worker_type", "auto") == "thread"
    proc = {"worker_type": "process"} if threads else {}
    io_n = max(cores, 4) * 2
    out: list[Candidate] = []
    if kind in ("storage", "consumer"):
        out += [Candidate({"num_workers": max(base_n, cores), "worker_concurrency": 8, **proc},
                          THREAD_SAFE_PROMISE),
                Candidate({"worker_type": "thread", "worker_concurrency": 16},
                          THREAD_SAFE_PROMISE),
                Candidate({"num_workers": io_n, "worker_concurrency": 1, **proc})]
    if kind == "transfer" and base_n > 0 and not threads and not kwargs.get("beyond_torch"):
        out.append(Candidate({"beyond_torch": {"slab_transport"}}, SLABS_PROMISE))
    if kind == "gil":
        out.append(Candidate({"worker_type": "process", "num_workers": cores,
                              "worker_concurrency": 1}))
    out += [Candidate({"num_workers": n, **proc}) for n in range(cores, 0, -1) if n != base_n]
    if base_n > 0 and not threads:
        out.append(Candidate({"prefetch_factor": 2 * int(kwargs.get("prefetch_factor") or 2)}))
    if cuda and not kwargs.get("pin_memory") and not kwargs.get("device"):
        out.append(Candidate({"pin_memory": True}))
    if cuda and not kwargs.get("device"):
        out.append(Candidate({"device": "cuda"}))  # copies overlap the step (side stream)
    if not kwargs.get("beyond_torch"):  # NOTE [ Same as torch unless asked ]
        beyond = Candidate({"beyond_torch": True}, BEYOND_TORCH_PROMISE)
        # first where it is the likeliest gain: batches handed over, or loaded in this thread
        if kind in ("transfer", "main_thread"):
            out.insert(0, beyond)
        else:
            out.append(beyond)
    # Threads inside a worker only add fetches that wait; for CPU work in Python they add
    # nothing on a quiet machine (one GIL per process), so they are not offered for it. (On
    # a busy machine more threads win a larger share of the CPUs from other processes: not a
    # gain the user would keep.)
    if draws_global_rng:
        out = [c for c in out if not needs_thread_safety(c, kwargs)]
    return _distinct(out, kwargs)[:limit]


def needs_thread_safety(cand: Candidate, kwargs: Mapping[str, Any]) -> bool:
    """The setting runs several ``__getitem__`` calls of one process at once."""
    merged = {**kwargs, **cand.overrides}
    conc = merged.get("worker_concurrency", "auto")
    return (cand.opt_in == THREAD_SAFE_PROMISE or merged.get("worker_type") == "thread"
            or (isinstance(conc, int) and conc > 1))


def _distinct(found: list[Candidate], kwargs: Mapping[str, Any]) -> list[Candidate]:
    seen: list[dict[str, Any]] = [dict(kwargs)]
    out = []
    for c in found:
        merged = {**kwargs, **c.overrides}
        if merged not in seen:
            seen.append(merged)
            out.append(c)
    return out


_DEFAULTS = {"batch_size": 1, "num_workers": 0, "pin_memory": False, "drop_last": False,
             "timeout": 0, "persistent_workers": False, "in_order": True,
             "worker_type": "auto", "worker_concurrency": "auto", "seeding": None,
             "beyond_torch": None,
             "on_error": "raise", "skip_budget": 0.01, "prefetch_factor": None,
             "device": None, "device_prefetch": 1, "device_transform": None,
             "multiprocessing_context": None, "generator": None, "worker_init_fn": None,
             "sampler": None, "batch_sampler": None, "collate_fn": None, "shuffle": None}
# The arguments the doctor's candidates change, named with their defaults when left at them.
_TRIED = ("prefetch_factor", "persistent_workers", "pin_memory", "worker_type",
          "worker_concurrency", "beyond_torch")


def _defaults(merged: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults for these arguments: with workers, torch's ``prefetch_factor`` is 2."""
    return {**_DEFAULTS, "prefetch_factor": 2 if merged.get("num_workers", 0) else None}


def code_line(kwargs: Mapping[str, Any], overrides: Mapping[str, Any]) -> str:
    """``stoker.DataLoader(dataset, ...)`` with the user's plain arguments and the change;
    an argument at its default is left out, as the user would leave it out."""
    merged = {**kwargs, **overrides}
    if merged.get("num_workers", 0) == 0:
        merged.pop("prefetch_factor", None)
    defaults = _defaults(merged)
    parts, hidden = ["dataset"], False
    for key, value in merged.items():
        if key == "...":  # arguments that were objects (a sampler, a collate_fn)
            hidden = True
            continue
        if key in defaults and value == defaults[key] and key not in overrides:
            continue
        if isinstance(value, (bool, int, float, str)) or value is None:
            parts.append(f"{key}={value!r}".replace("'", '"'))
        else:
            hidden = True
    if hidden:
        parts.insert(1, "...")
    return f"stoker.DataLoader({', '.join(parts)})"


def defaults_left(kwargs: Mapping[str, Any]) -> str:
    """The arguments a candidate may change that ``kwargs`` leaves at their defaults, as
    ``name=value`` (the default in effect), for the report's "your setting"."""
    defaults = _defaults(kwargs)
    workers = kwargs.get("num_workers", 0) > 0
    out = []
    for key in _TRIED:
        if key in ("prefetch_factor", "persistent_workers") and not workers:
            continue  # torch refuses them without workers
        if key not in kwargs and "..." in kwargs:
            continue  # perhaps one of the objects left out (records.plain_kwargs): unknown
        if kwargs.get(key, defaults[key]) == defaults[key]:
            out.append(f"{key}={defaults[key]!r}".replace("'", '"'))
    return ", ".join(out)
