"""User-style samplers, batch samplers, collate_fns and worker_init_fns built from
``_fuzz_spec`` (the datasets are in ``_fuzz_cases``).

Module-level and picklable, like the datasets. Samplers run in the main process (torch never
sends them to workers), so they log into the ``Log`` the test loop writes to: the record shows
when the loader advanced them against the loop's progress. Collates and worker_init_fns record
what they observed into the batch and onto the worker's copy of the dataset.
"""

from __future__ import annotations

import os
import random
import threading
from typing import Any

import numpy as np
import torch
from _fuzz_cases import Log, make_exception, view_of
from _fuzz_spec import BatchSamplerSpec, CollateSpec, SamplerSpec, WorkerInitSpec
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    get_worker_info,
)

# --------------------------------------------------------------------------------------------
# Samplers and batch samplers
# --------------------------------------------------------------------------------------------


class LoggingSampler(Sampler[int]):
    """A user sampler: logs ``__iter__``, each index it yields and ``__len__``.

    ``stateful``: a new order every epoch (counts its ``__iter__`` calls); ``progress``: reads
    how many batches the loop has received when it yields; ``raising``: fails on the 3rd index;
    ``nolen``: this class as it is, without ``__len__`` (the others get ``SizedLoggingSampler``).
    """

    def __init__(self, spec: SamplerSpec, n: int, log: Log, progress: dict[str, int]) -> None:
        self.spec, self.n, self.log, self.progress = spec, n, log, progress
        self.epoch = 0

    def _order(self) -> list[int]:
        kind, n = self.spec.kind, self.n
        if kind == "rev":
            return list(range(n))[::-1]
        if kind == "stateful":
            shift = self.epoch * 3
            return [(i + shift) % n for i in range(n)] if n else []
        return list(range(n))

    def __iter__(self) -> Any:
        self.log.add("sampler.iter", self.spec.kind)
        self.epoch += 1
        order = self._order()
        for k, index in enumerate(order):
            if self.spec.kind == "progress":
                index = (index + self.progress["received"]) % self.n
            if self.spec.kind == "raising" and k == 2:
                raise make_exception("coded", "sampler")
            self.log.add("sampler.next", index)
            self.progress["drawn"] = self.progress.get("drawn", 0) + 1  # the datasets' "drawn"
            yield index


class SizedLoggingSampler(LoggingSampler):
    def __len__(self) -> int:
        self.log.add("sampler.len")
        return self.n


def build_sampler(spec: SamplerSpec, n: int, log: Log, progress: dict[str, int]) -> Any:
    kind = spec.kind
    gen = torch.Generator().manual_seed(spec.seed)
    if kind == "seq":
        return SequentialSampler(range(n))
    if kind == "list":
        return [(3 * i + 1) % max(n, 1) for i in range(n)]
    if kind == "random":
        return RandomSampler(range(n))  # draws from the main process's torch RNG
    if kind == "random_gen":
        return RandomSampler(range(n), generator=gen)
    if kind == "random_repl":
        return RandomSampler(range(n), replacement=True, num_samples=n + 2, generator=gen)
    if kind == "subset_random":
        return SubsetRandomSampler(list(range(0, n, 2)), generator=gen)
    if kind == "weighted":
        return WeightedRandomSampler([float(i % 3 + 1) for i in range(n)], n, generator=gen)
    if kind == "neg":  # torch's classes only: negative indices (valid ones, unless short)
        return [-1 - (3 * i) % max(n, 1) for i in range(n)]
    if kind == "np":  # torch's classes only: numpy ints
        return np.arange(n)[::-1].copy()
    if kind == "nolen":
        return LoggingSampler(spec, n, log, progress)
    return SizedLoggingSampler(spec, n, log, progress)


class LoggingBatchSampler(Sampler[list[int]]):
    """A user batch sampler: ``variable`` batch sizes 1, 2, 3, 1, 2, 3...; ``stateful`` a
    different split every epoch; ``progress`` batches sized by the loop's progress."""

    def __init__(self, spec: BatchSamplerSpec, n: int, log: Log, progress: dict[str, int]) -> None:
        self.spec, self.n, self.log, self.progress = spec, n, log, progress
        self.epoch = 0

    def __iter__(self) -> Any:
        self.log.add("batch_sampler.iter", self.spec.kind)
        self.epoch += 1
        start, k = 0, 0
        while start < self.n:
            if self.spec.kind == "stateful":
                size = 1 + (k + self.epoch) % 3
            elif self.spec.kind == "progress":
                size = 1 + self.progress["received"] % 3
            else:
                size = 1 + k % 3
            batch = list(range(start, min(self.n, start + size)))
            self.log.add("batch_sampler.next", tuple(batch))
            yield batch
            start, k = start + size, k + 1

    def __len__(self) -> int:
        self.log.add("batch_sampler.len")
        return (self.n + 1) // 2


def build_batch_sampler(
    spec: BatchSamplerSpec, n: int, log: Log, progress: dict[str, int]
) -> Any:
    if spec.kind == "torch":
        assert spec.sampler is not None
        inner = build_sampler(spec.sampler, n, log, progress)
        return BatchSampler(inner, spec.batch_size, spec.drop_last)
    return LoggingBatchSampler(spec, n, log, progress)


# --------------------------------------------------------------------------------------------
# Collates and worker_init_fns
# --------------------------------------------------------------------------------------------

COLLATE_OBS = ("c_wid", "c_seed", "c_py", "c_np", "c_th", "c_main", "c_calls", "c_pid", "c_n")


def _first_array(tree: Any) -> Any:
    if isinstance(tree, (torch.Tensor, np.ndarray)):
        return tree
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        for child in tree:
            found = _first_array(child)
            if found is not None:
                return found
    return None


def _to_numpy(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.numpy()
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_to_numpy(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_numpy(v) for v in tree)
    return tree


class FuzzCollate:
    """A user collate_fn: a base behaviour plus observations, aliasing and a fault."""

    def __init__(self, spec: CollateSpec, log: Log) -> None:
        self.spec, self.log = spec, log
        self.calls = 0

    def _observe(self, name: str, batch: list[Any]) -> Any:
        info = get_worker_info()
        values = {
            "c_wid": lambda: -1 if info is None else info.id,
            "c_seed": lambda: "none" if info is None else str(info.seed),
            "c_py": random.random,
            "c_np": lambda: int(np.random.randint(0, 1 << 30)),
            "c_th": lambda: int(torch.randint(0, 1 << 30, ())),
            "c_main": lambda: threading.current_thread() is threading.main_thread(),
            "c_calls": lambda: self.calls,
            "c_pid": lambda: f"pid:{os.getpid()}",
            "c_n": lambda: len(batch) if isinstance(batch, list) else -1,
        }
        return values[name]()

    def __call__(self, batch: Any) -> Any:
        self.calls += 1
        spec = self.spec
        self.log.add("collate", spec.tag, len(batch) if isinstance(batch, list) else -1)
        fault = spec.fault
        info = get_worker_info()
        if fault is not None and fault.at == self.calls and (
            fault.worker is None or (info is not None and info.id == fault.worker)
        ):
            raise make_exception(spec.fault.exc, f"collate call {self.calls}")
        if spec.base == "default":
            out = default_collate(batch)
        elif spec.base == "convert":
            out = default_convert(batch)
        elif spec.base == "identity":
            out = batch
        elif spec.base == "numpy":
            out = _to_numpy(default_collate(batch))
        else:  # "first"
            out = batch[0] if isinstance(batch, list) and batch else batch
        if not spec.obs and not spec.alias:
            return out
        extra: dict[str, Any] = {name: self._observe(name, batch) for name in spec.obs}
        if spec.alias:
            first = _first_array(out)
            extra["same"] = first
            extra["view"] = view_of(first) if first is not None else None
        return {"batch": out, "tag": spec.tag, "extra": extra}


class FuzzWorkerInit:
    """A user worker_init_fn: records what it sees on its dataset copy; may reseed numpy."""

    def __init__(self, spec: WorkerInitSpec) -> None:
        self.spec = spec

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        spec = self.spec
        if spec.fault_worker == worker_id:
            raise make_exception("coded", f"worker_init_fn {worker_id}")
        if spec.reseed_np:
            np.random.seed(info.seed % 2**32)
        if spec.draws:
            info.dataset.init_obs = (
                f"{spec.tag}:{worker_id}:{info.id}/{info.num_workers}:{info.seed}:"
                f"{torch.initial_seed()}:{random.random()!r}:{np.random.randint(1 << 30)}:"
                f"{int(torch.randint(1 << 30, ()))}"
            )
