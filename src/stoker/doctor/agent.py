"""Inside the user's script under ``stoker doctor -- python train.py``.

NOTE [ The doctor attaches from above ]
The loader imports nothing of the doctor. The doctor starts the script with a folder of its
own first on ``PYTHONPATH``, holding a ``sitecustomize`` (``SITECUSTOMIZE``); as the
interpreter starts, before the script runs, it calls ``install``, which registers ``attach``
with ``stoker._core.stats.on_every_loader`` (importing neither torch nor the loader), then runs
the ``sitecustomize`` it stands in front of, if any. Every stoker loader built from then on
calls ``attach`` at the end of its ``__init__``. So any command the doctor runs is measured
(``python train.py``, torchrun, a console script) whose Python reads ``PYTHONPATH`` and runs
``site`` (not ``-E``, ``-I`` or ``-S``).

``STOKER_DOCTOR`` is the path this process writes its measurement to; the doctor's settings
arrive in ``STOKER_DOCTOR_CONFIG`` (JSON: bounds, the arguments to override, whether to record
the timeline). The first loader to deliver a batch is measured, with the script's own training
step between batches; once the bounds are reached the measurement is written and the script is
ended with ``SystemExit`` (its ``finally`` blocks and the loaders' shutdown run as usual). A
script that ends sooner writes what it measured at exit.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stoker._core.stats import on_every_loader

if TYPE_CHECKING:
    from stoker._core.stats import LoaderStats
    from stoker.loader import DataLoader

OUT_ENV = "STOKER_DOCTOR"
CONFIG_ENV = "STOKER_DOCTOR_CONFIG"
# The script's startup file (NOTE [ The doctor attaches from above ]); stoker missing: nothing.
SITECUSTOMIZE = """try:
    from stoker.doctor.agent import install
except ImportError:
    pass
else:
    install(__file__)
"""
_ADJUSTABLE = ("num_workers", "prefetch_factor", "pin_memory", "worker_type",
               "worker_concurrency")


class _Agent:
    def __init__(self, out_path: str, config: dict[str, Any]) -> None:
        from stoker.doctor.measure import Bounds, Run

        self.out_path = out_path
        self.overrides: dict[str, Any] = config.get("overrides", {})
        self.detailed = bool(config.get("detailed"))
        self.bounds = Bounds(batches=int(config["batches"]), seconds=float(config["seconds"]))
        self.run = Run(str(config.get("label", "your setting")), dict(self.overrides))
        self.measured: DataLoader[Any] | None = None  # the loader measured (first to deliver)
        self.kwargs: dict[str, Any] = {}
        self.warm_stats: LoaderStats | None = None
        self.watcher: Any = None
        self.written = False
        self.draws_global_rng: bool | None = None
        atexit.register(self.write)

    def attach(self, loader: DataLoader[Any]) -> None:
        for key, value in self.overrides.items():
            if key in _ADJUSTABLE:
                setattr(loader, key, value)
        if loader.num_workers > 0 and loader.prefetch_factor is None:
            loader.prefetch_factor = 2  # what torch's constructor sets with workers
        events = loader.record_timeline() if self.detailed else None
        loader.add_stats_hook(_Told(self, loader, events))

    def delivered(self, told: _Told, samples: int, now: float,
                  stats: Callable[[], LoaderStats]) -> None:
        loader = told.loader()
        if loader is None:
            return
        if self.measured is None:
            self._start(loader, told)
        if loader is not self.measured:
            return
        run = self.run
        run.batch_times.append((now, samples))
        if not run.first_batch_s:
            run.first_batch_s = now - run.started
        if self.warm_stats is None:
            if len(run.batch_times) >= self.bounds.warmup_batches and (
                now - run.started >= self.bounds.warmup_s
            ):
                self.warm_stats, run.warm_at = stats(), now
            return
        run.batches += 1
        run.samples += samples
        run.seconds = now - run.warm_at
        if run.batches >= self.bounds.batches or run.seconds >= self.bounds.seconds:
            self.write()
            raise SystemExit(0)

    def _start(self, loader: DataLoader[Any], told: _Told) -> None:
        from stoker.doctor.loader_kwargs import kwargs_of
        from stoker.doctor.measure import _MemoryWatcher
        from stoker.doctor.records import plain_kwargs
        from stoker.doctor.rng_probe import draws_global_rng

        self.measured = loader
        self.kwargs = plain_kwargs(kwargs_of(loader))
        from stoker.loader import DataLoader

        # through the class: a subclass may use the name (NOTE [ A subclass's names ])
        self.run.plan = str(DataLoader.plan(loader)) if isinstance(loader, DataLoader) else ""
        if self.detailed:  # the first run: the one the verdict comes from
            self.draws_global_rng = draws_global_rng(loader.dataset)
        self.run.started = told.attached_at
        if self.detailed:
            self.run.events = told.events
            self.watcher = _MemoryWatcher()

    def write(self) -> None:
        if self.written:
            return
        self.written = True
        from stoker.doctor.measure import stats_between
        from stoker.doctor.records import run_to_dict

        run = self.run
        if self.watcher is not None:
            run.memory = self.watcher.stop()
        if self.measured is not None:
            now_stats = self.measured.stats()
            run.stats = now_stats
            if self.warm_stats is not None:
                run.stats = stats_between(self.warm_stats, now_stats)
            run.samples_per_s = run.samples / run.seconds if run.seconds > 0 else 0.0
        doc = {"run": run_to_dict(run), "kwargs": self.kwargs,
               "measured": self.measured is not None,
               "draws_global_rng": self.draws_global_rng}
        tmp = self.out_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self.out_path)


class _Told:
    """The agent's ``StatsHook`` on one loader (weakly: the script owns its loaders)."""

    def __init__(self, agent: _Agent, loader: DataLoader[Any], events: Any) -> None:
        self.agent = agent
        self.loader = weakref.ref(loader)
        self.events = events
        self.attached_at = time.perf_counter()

    def batch_delivered(self, samples: int, at: float, stats: Callable[[], LoaderStats]
                        ) -> None:
        self.agent.delivered(self, samples, at, stats)


_agent: _Agent | None = None


def install(startup_file: str) -> None:
    """NOTE [ The doctor attaches from above ]: every stoker loader built from now on is
    attached; then the ``sitecustomize`` that ``startup_file`` stands in front of runs."""
    on_every_loader(attach)
    ours = os.path.dirname(os.path.abspath(startup_file))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != ours]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def attach(loader: DataLoader[Any]) -> None:
    global _agent
    if _agent is None:
        _agent = _Agent(os.environ[OUT_ENV], json.loads(os.environ.get(CONFIG_ENV, "{}")
                                                         or "{}"))
    _agent.attach(loader)
