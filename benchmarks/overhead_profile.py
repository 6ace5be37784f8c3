"""Where a loader's own CPU time goes per batch, torch's and stoker's at the defaults, against
the user's own work (``__getitem__`` for each index and ``default_collate``, no loader).

    .venv/bin/python benchmarks/overhead_profile.py [--epochs N] [--only ...] [--cprofile DIR]

CPU time, not wall time: the figures hold on a loaded machine. For `tiny` (num_workers=2)
each epoch's main-process CPU (``os.times()`` of this process: every thread) and the workers'
(``os.times()`` children, counted once both loaders have joined their workers at the epoch's
end; non-persistent workers, so a worker's fork and exit are in it, as in any epoch) are
divided by the epoch's batches. `user work` is the same batches' ``default_collate([ds[i] for
i in batch])`` in a plain loop in this thread: the CPU a batch costs any loader that keeps
torch's run, so ``user / (main + workers)`` is the fraction of the two-process bound that the
loader could reach with both cores busy. `torch transport` is what torch's way of sending a
batch adds to that in one thread (``transport_floor``: collate into new shared memory, pickle
with torch's reductions, rebuild from the fds, free), so ``main + workers - user - transport``
is what is left for the loader's own loop, messages and bookkeeping (and the workers' fork
and exit). `tensor_dataset` is the same with the rows in torch's ``TensorDataset`` (stoker
gathers its batch in the worker, so its figure can fall below the user's work). For
`per_sample` (num_workers=0) the epoch runs in this thread (``time.thread_time``).

With ``--cprofile DIR`` each loader's main process and workers are run under cProfile timed by
``time.thread_time`` (one more epoch each; its own overhead inflates Python-heavy code) and
their top functions by own CPU time written to DIR, for `tiny` and `tensor_dataset` as
``--only`` names them (files ``<loader>-<workload>-main.txt`` and
``<loader>-<workload>-worker-<pid>.txt``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads.per_sample import BranchyDataset  # noqa: E402
from workloads.tiny import TinyDataset  # noqa: E402

import stoker  # noqa: E402

LOADERS = {"torch": torch.utils.data.DataLoader, "stoker": stoker.DataLoader}


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


class Plain:
    """The user's work alone, and with torch's transport, in this thread: CPU seconds per
    batch over ``batches`` shuffled batches, measured between the loaders' epochs (a core's
    speed drifts on a shared machine)."""

    def __init__(self, dataset: Any, batches: int, batch_size: int = 256) -> None:
        self.dataset, self.batches, self.batch_size = dataset, batches, batch_size

    def _batches(self) -> list[list[int]]:
        order, size = torch.randperm(len(self.dataset)).tolist(), self.batch_size
        return [order[b * size:(b + 1) * size] for b in range(self.batches)]

    def user_work(self) -> float:
        """``default_collate([dataset[i] for i in batch])``: what any loader that keeps
        torch's run does per batch."""
        dataset, batches = self.dataset, self._batches()
        start = time.thread_time()
        for indices in batches:
            default_collate([dataset[i] for i in indices])
        return (time.thread_time() - start) / len(batches)

    def transport_floor(self) -> float:
        """The user's work plus torch's transport, both ends: ``default_collate`` as in a
        worker (its outputs in new shared memory), pickled with torch's reductions
        (``transport.torch_way.dumps``), freed, rebuilt from the fds (``loads``: mmap) and
        freed. No loader, no messages: what the torch way costs by itself."""
        from torch.utils.data._utils import worker as torch_worker

        from stoker.transport import torch_way

        dataset, batches = self.dataset, self._batches()
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=0, num_workers=2, seed=0, dataset=dataset)  # collate into shared memory
        try:
            start = time.thread_time()
            for indices in batches:
                batch = default_collate([dataset[i] for i in indices])
                payload, fds, _ = torch_way.dumps(batch)
                del batch
                torch_way.loads(payload, fds)
            return (time.thread_time() - start) / len(batches)
        finally:
            torch_worker._worker_info = None


def epoch_cpu(loader: Any) -> tuple[float, float, int]:
    """(main CPU s, workers' CPU s, batches) of one epoch."""
    main0, kids0 = _self_cpu(), _children_cpu()
    n = sum(1 for _ in loader)
    return _self_cpu() - main0, _children_cpu() - kids0, n


def _med(values: list[float]) -> float:
    return statistics.median(values) * 1e3  # ms


def profile_tiny(epochs: int, tensors: bool = False) -> dict[str, Any]:
    """``tensors``: the same rows as torch's ``TensorDataset`` (gathered in the worker)."""
    rows = TinyDataset(200_000)
    dataset = torch.utils.data.TensorDataset(rows.x, rows.y) if tensors else rows
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 2}
    loaders = {name: cls(dataset, **kwargs) for name, cls in LOADERS.items()}
    plain = Plain(dataset, 200)
    for loader in loaders.values():
        epoch_cpu(loader)  # warm-up
    got: dict[str, list[float]] = {k: [] for k in ("user", "floor")}
    for name in loaders:
        got[name + " main"], got[name + " workers"], got[name + " all"] = [], [], []
    for r in range(epochs):
        for name in (loaders if r % 2 == 0 else list(loaders)[::-1]):
            m, w, n = epoch_cpu(loaders[name])
            got[name + " main"].append(m / n)
            got[name + " workers"].append(w / n)
            got[name + " all"].append((m + w) / n)
        got["user"].append(plain.user_work())
        got["floor"].append(plain.transport_floor())
    user, floor = _med(got["user"]), _med(got["floor"])
    out: dict[str, Any] = {"user_work_ms": user, "torch_transport_ms": floor - user}
    for name in loaders:
        total = _med(got[name + " all"])
        out[name] = {"main_ms": _med(got[name + " main"]),
                     "workers_ms": _med(got[name + " workers"]),
                     "beyond_user_and_transport_ms": total - floor,
                     "fraction_of_two_process_bound": user / total}
    out["ratio_cpu"] = _med(got["torch all"]) / _med(got["stoker all"])
    return out


def profile_per_sample(epochs: int) -> dict[str, Any]:
    dataset = BranchyDataset(200_000)
    kwargs = {"batch_size": 256, "shuffle": True, "num_workers": 0}
    loaders = {name: cls(dataset, **kwargs) for name, cls in LOADERS.items()}
    plain = Plain(dataset, 200)
    spent: dict[str, list[float]] = {n: [] for n in (*loaders, "user")}
    for loader in loaders.values():
        sum(1 for _ in loader)
    for r in range(epochs):
        for name in (loaders if r % 2 == 0 else list(loaders)[::-1]):
            start = time.thread_time()
            n = sum(1 for _ in loaders[name])
            spent[name].append((time.thread_time() - start) / n)
        spent["user"].append(plain.user_work())
    user = _med(spent["user"])
    out: dict[str, Any] = {"user_work_ms": user}
    for name in loaders:
        cpu = _med(spent[name])
        out[name] = {"main_ms": cpu, "beyond_user_ms": cpu - user}
    out["ratio_cpu"] = _med(spent["torch"]) / _med(spent["stoker"])
    return out


def _dump(profile: cProfile.Profile, path: Path) -> None:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    path.write_text(text.getvalue())


def cprofile_tiny(out_dir: Path, tensors: bool = False) -> None:
    """One epoch per loader with cProfile in the main process and each worker (forked: the
    wrapped worker entry points are inherited); ``tensors``: the rows in torch's
    ``TensorDataset``."""
    from torch.utils.data._utils import worker as torch_worker

    from stoker.workers import main_loop

    out_dir.mkdir(parents=True, exist_ok=True)
    serve, loop = main_loop.Worker.serve, torch_worker._worker_loop

    workload = "tensor_dataset" if tensors else "tiny"

    def profiled(fn: Any, tag: str) -> Any:
        def run(*args: Any, **kw: Any) -> Any:
            p = cProfile.Profile(time.thread_time)  # CPU, not waits
            try:
                return p.runcall(fn, *args, **kw)
            finally:
                _dump(p, out_dir / f"{tag}-{workload}-worker-{os.getpid()}.txt")
        return run

    main_loop.Worker.serve = profiled(serve, "stoker")  # type: ignore[method-assign]
    torch_worker._worker_loop = profiled(loop, "torch")
    try:
        rows = TinyDataset(200_000)
        dataset = torch.utils.data.TensorDataset(rows.x, rows.y) if tensors else rows
        for name, cls in LOADERS.items():
            loader = cls(dataset, batch_size=256, shuffle=True, num_workers=2)
            sum(1 for _ in loader)
            p = cProfile.Profile(time.thread_time)
            p.runcall(lambda loader=loader: sum(1 for _ in loader))
            _dump(p, out_dir / f"{name}-{workload}-main.txt")
    finally:
        main_loop.Worker.serve = serve  # type: ignore[method-assign]
        torch_worker._worker_loop = loop


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--only", choices=("tiny", "tensor_dataset", "per_sample"), nargs="+",
                        default=("tiny", "per_sample"))
    parser.add_argument("--cprofile", type=Path)
    args = parser.parse_args()
    if args.cprofile is not None:
        for workload in ("tiny", "tensor_dataset"):
            if workload in args.only:
                cprofile_tiny(args.cprofile, tensors=workload == "tensor_dataset")
        return 0
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load}")
    if "tiny" in args.only:
        _show("tiny, num_workers=2", profile_tiny(args.epochs))
    if "tensor_dataset" in args.only:
        _show("tiny TensorDataset, num_workers=2", profile_tiny(args.epochs, tensors=True))
    if "per_sample" in args.only:
        _show("per_sample, num_workers=0", profile_per_sample(args.epochs))
    return 0


def _show(title: str, figures: dict[str, Any]) -> None:
    """Figures as one line each: CPU ms per batch (medians over the rounds)."""
    print(f"{title}, CPU ms per batch (median over rounds):")
    for key, value in figures.items():
        if isinstance(value, dict):
            cells = ", ".join(f"{k.removesuffix('_ms')} {v:.3f}" for k, v in value.items())
            print(f"  {key}: {cells}")
        else:
            print(f"  {key.removesuffix('_ms')}: {value:.3f}")
    print(f"  ({json.dumps(figures)})")


if __name__ == "__main__":
    raise SystemExit(main())
