"""Issue 44: on a run that succeeds, the loader says through ``warnings`` exactly what torch
2.13's DataLoader says, attributed as torch attributes it, and nothing else.

Each test runs the same script through torch's DataLoader and the loader under test in one
process and compares what ``warnings`` recorded: category, text, ``filename`` and ``lineno``
and the count, under ``simplefilter("always")``, under ``filterwarnings("ignore",
module="torch")`` (the module a warning is attributed to), under ``-W error`` (where the run
stops), and under the default filters, where "once per location" lives in the attributed
module's ``__warningregistry__``: the loader's warnings must count against torch's own, in
both orders. stoker's own advice (a generator every worker copies, copy-on-read memory growth)
goes to its loggers and ``loader.stats().advice`` and must not stop a run under ``-W error``
that torch's completes. Each failed before issue 44 (NOTE [ torch's voice ] in
``stoker/_core/torch_voice.py``).

Under ``STOKER_TEST_LOADER=torch`` both sides are torch's: the expectations are torch's own.
"""

from __future__ import annotations

import logging
import random
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from _probe_run import run_probe

import stoker
from stoker.engine import loader_state, process_iter
from stoker.profile.memory_watch import MIB, MemoryWatch

MARK = "issue 44: iter(loader) returned"  # where in the script each warning came
TIMEOUT_S = 60


class Squares(torch.utils.data.Dataset):
    def __init__(self, n: int = 8) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i * i


class Overlong(torch.utils.data.IterableDataset):
    """Says 4 samples, yields 12 (12 per worker: no sharding). torch compares the samples it
    was told with the *batches* it yielded: 6 batches of 2 (12 with two workers) are more."""

    def __len__(self) -> int:
        return 4

    def __iter__(self) -> Any:
        return iter(range(12))


@dataclass(frozen=True)
class Case:
    dataset: Callable[[], Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    call_len: bool = False  # torch warns of an overlong IterableDataset only after len()


_NO_ACCELERATOR = pytest.mark.skipif(torch.accelerator.is_available(),
                                     reason="torch warns of pin_memory only without one")
CASES = {
    "pin_memory, num_workers=0": pytest.param(Case(Squares, {"pin_memory": True}),
                                              marks=_NO_ACCELERATOR),
    "pin_memory, num_workers=2": pytest.param(
        Case(Squares, {"pin_memory": True, "num_workers": 2, "timeout": TIMEOUT_S}),
        marks=_NO_ACCELERATOR),
    "pin_memory_device": pytest.param(
        Case(Squares, {"pin_memory": True, "pin_memory_device": "cuda", "num_workers": 2,
                       "timeout": TIMEOUT_S}), marks=_NO_ACCELERATOR),
    "overlong iterable, num_workers=0": Case(Overlong, call_len=True),
    "overlong iterable, num_workers=2": Case(Overlong, {"num_workers": 2, "timeout": TIMEOUT_S},
                                             call_len=True),
    "more workers than CPUs": Case(
        Squares, {"num_workers": (torch._utils.cpu_count() or 1) + 1, "timeout": TIMEOUT_S}),
}
_IDS = list(CASES)
_CASES = list(CASES.values())


def _script(cls: type, case: Case, dataset: Any) -> list[list[list[int]]]:
    """Two epochs; MARK between ``iter()`` and the first batch of each."""
    loader = cls(dataset, batch_size=2, **case.kwargs)
    if case.call_len:
        len(loader)
    epochs = []
    for _ in range(2):
        it = iter(loader)
        warnings.warn(MARK, UserWarning, stacklevel=1)
        epochs.append([b.tolist() for b in it])
    return epochs


def always() -> None:
    warnings.simplefilter("always")


def torch_ignored() -> None:
    warnings.simplefilter("always")
    warnings.filterwarnings("ignore", module="torch")


def by_default() -> None:
    warnings.simplefilter("default")  # Python's action for UserWarning: once per location


def _said(runs: list[Callable[[], object]], filters: Callable[[], None]) -> list[tuple]:
    """What ``warnings`` shows for ``runs``, one after the other in one filter state (entering
    it resets every registry: the runs start from the same "once" memory)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        filters()
        for run in runs:
            run()
    return [(w.category, str(w.message), w.filename, w.lineno) for w in caught]


@pytest.mark.parametrize("filters", [always, torch_ignored])
@pytest.mark.parametrize("case", _CASES, ids=_IDS)
def test_torchs_warnings_are_given_as_torch_gives_them(Loader, TorchLoader, case, filters):
    dataset = case.dataset()  # one object: torch's length warning names it
    batches: dict[str, Any] = {}
    expected = _said([lambda: batches.setdefault("torch", _script(TorchLoader, case, dataset))],
                     filters)
    got = _said([lambda: batches.setdefault("tested", _script(Loader, case, dataset))], filters)
    assert got == expected
    assert batches["tested"] == batches["torch"]
    torch_says = [w for w in expected if w[1] != MARK]
    if filters is always:
        assert torch_says, "torch warns here"
    elif case.dataset is not Overlong:  # its warning is attributed to the caller of next()
        assert torch_says == []


@pytest.mark.parametrize("torch_first", [False, True], ids=["tested first", "torch first"])
@pytest.mark.parametrize("case", _CASES, ids=_IDS)
def test_once_per_location_is_shared_with_torch(Loader, TorchLoader, case, torch_first):
    """Under the default filters torch's warnings show once per place they are attributed to;
    run after torch's loader the loader under test adds nothing, and run first it says what
    torch alone would have said, after which torch's own are not shown again."""
    dataset = case.dataset()
    expected = _said([lambda: _script(TorchLoader, case, dataset)], by_default)
    assert _said([lambda: _script(Loader, case, dataset)], by_default) == expected
    runs = [lambda: _script(Loader, case, dataset), lambda: _script(TorchLoader, case, dataset)]
    assert _said(runs[::-1] if torch_first else runs, by_default) == expected


def _stops_at(cls: type, case: Case, dataset: Any) -> tuple[str, type, str]:
    """Where the script stops under ``-W error``, with what."""
    stage = "DataLoader()"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            loader = cls(dataset, batch_size=2, **case.kwargs)
            stage = "len()"
            if case.call_len:
                len(loader)
            stage = "iter()"
            it = iter(loader)
            stage = "next()"
            for _ in it:
                pass
        except UserWarning as exc:
            return stage, type(exc), str(exc)
    return "nowhere", type(None), ""


# torch's worker iterator, stopped in its __init__, fails again in its __del__ (no _shutdown).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("case", _CASES, ids=_IDS)
def test_torchs_warnings_stop_a_run_under_error_where_torchs_do(Loader, TorchLoader, case):
    dataset = case.dataset()
    expected = _stops_at(TorchLoader, case, dataset)
    assert expected[0] != "nowhere"
    assert _stops_at(Loader, case, dataset) == expected


# -- stoker's own advice: logging and stats(), never warnings -----------------------------------


class OwnsGenerator(torch.utils.data.Dataset):
    """A generator made in ``__init__``: every worker draws from an identical copy."""

    def __init__(self, kind: str) -> None:
        self.rng: Any = {
            "numpy": lambda: np.random.default_rng(0),
            "torch": lambda: torch.Generator().manual_seed(0),
            "random": lambda: random.Random(0),
        }[kind]()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if isinstance(self.rng, torch.Generator):
            draw = int(torch.randint(1000, (), generator=self.rng))
        elif isinstance(self.rng, random.Random):
            draw = self.rng.randrange(1000)
        else:
            draw = int(self.rng.integers(1000))
        return torch.tensor([i, draw])


def _under_error(cls: type, dataset: Any, **kwargs: Any) -> tuple[Any, list]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -W error, pytest's filterwarnings = error
        loader = cls(dataset, batch_size=2, num_workers=2, timeout=TIMEOUT_S, **kwargs)
        return loader, [b.tolist() for b in loader]


@pytest.mark.parametrize("kind", ["numpy", "torch", "random"])
def test_a_dataset_generator_does_not_stop_a_run_under_error(Loader, TorchLoader, kind, caplog):
    _, expected = _under_error(TorchLoader, OwnsGenerator(kind))
    with caplog.at_level(logging.DEBUG, "stoker.sampling.dataset_rngs"):
        loader, got = _under_error(Loader, OwnsGenerator(kind))
    assert got == expected  # torch's draws: the copies repeat across workers
    if isinstance(loader, stoker.DataLoader):
        advice = [r.getMessage() for r in caplog.records
                  if r.name == "stoker.sampling.dataset_rngs"]
        assert len(advice) == 1 and "each of the 2 workers gets an identical copy" in advice[0]
        assert loader.stats().advice == tuple(advice)


class _Growing:
    """A USS reader: every worker's private memory 100 MiB larger at each read."""

    def __init__(self) -> None:
        self.reads: dict[int, int] = {}

    def __call__(self, pid: int) -> int:
        self.reads[pid] = self.reads.get(pid, 0) + 1
        return self.reads[pid] * 100 * MIB


def test_copy_on_read_advice_does_not_stop_a_run_under_error(
    stoker_only, TorchLoader, monkeypatch, caplog
):
    """The loader's own memory watch, made to see growth at every read of a worker's USS."""
    monkeypatch.setattr(process_iter, "_WATCH_DELAY_S", 0.0)
    monkeypatch.setattr(loader_state, "_memory_watch", lambda dataset, stats: MemoryWatch(
        dataset, interval_s=0.0, clock=lambda: 0.0, read_uss=_Growing(), tell=stats.advise))
    _, expected = _under_error(TorchLoader, Squares(32))
    with caplog.at_level(logging.DEBUG, "stoker.profile.memory_watch"):
        loader, got = _under_error(stoker.DataLoader, Squares(32))
    assert got == expected
    told = [r.getMessage() for r in caplog.records if r.name == "stoker.profile.memory_watch"]
    assert len(told) == 1, told
    assert told[0].startswith("stoker: DataLoader worker memory keeps growing: the private "
                              "memory (USS) of worker pid ")
    assert loader.stats().advice == (told[0],)


def _prints(loader: str, mode: str, **env: str) -> tuple[str, str]:
    proc = run_probe(loader, "_quiet_script.py", mode, **env)
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("mode", ["unconfigured", "info"])
def test_a_script_that_succeeds_prints_what_it_prints_under_torch(loader_name, mode):
    """A whole program in a fresh interpreter, with logging left alone or configured at INFO
    (``logging.basicConfig``): stdout and stderr as under torch, byte for byte. stoker's
    advice on these datasets (a generator every worker copies, torch's TensorDataset batched
    as gathers) reached stderr through ``logging.lastResort``, and INFO under
    ``basicConfig``: NOTE [ Advice is quiet ]."""
    expected = _prints("torch", mode)
    assert expected[0].count("\n") == 6 and expected[1] == "", expected
    assert _prints(loader_name, mode) == expected


def test_a_script_that_warns_on_default_encodings_runs_as_under_torch(loader_name):
    """``PYTHONWARNDEFAULTENCODING=1`` with ``EncodingWarning`` an error after the imports:
    torch's loader opens no text file, and stoker's must not either (found by a sweep: a
    worker start read ``/proc/self/maps`` without ``encoding=``)."""
    env = {"PYTHONWARNDEFAULTENCODING": "1"}
    expected = _prints("torch", "encoding", **env)
    assert expected[0].count("\n") == 6, expected
    assert _prints(loader_name, "encoding", **env) == expected


@pytest.mark.parametrize("mode", ["persistent", "iterator"])
def test_a_loader_alive_at_exit_leaves_what_torchs_leaves(loader_name, mode):
    """Workers still up at interpreter exit end as torch's do, by SIGTERM: what the dataset
    printed into a block-buffered stdout is not written after the script's last line (found
    by a sweep: stoker's workers flushed it; NOTE [ Workers at interpreter exit ])."""
    env = {"PYTHONUNBUFFERED": ""}
    expected = run_probe("torch", "_alive_at_exit_script.py", mode, **env)
    assert expected.stdout.splitlines()[-1] == "training done", expected.stdout
    got = run_probe(loader_name, "_alive_at_exit_script.py", mode, **env)
    assert (got.stdout, got.stderr) == (expected.stdout, expected.stderr)


@pytest.mark.parametrize("mode", ["sampler", "pin_warning"])
def test_an_iterator_that_failed_half_built_says_what_torchs_says(loader_name, mode):
    """A worker iterator whose build raised before torch's sets ``_shutdown`` (its sampler's
    iter(), the pin_memory warning as an error): torch's __del__ then prints "Exception ignored
    in ... AttributeError", and a program that caught the error shows that on stderr (found by
    sweeps: stoker said nothing; NOTE [ torch's half-built iterator ])."""
    expected = run_probe("torch", "_half_built_script.py", mode)
    assert "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__" in (
        expected.stderr), expected.stderr
    got = run_probe(loader_name, "_half_built_script.py", mode)
    address = re.compile(r"0x[0-9a-f]+")
    assert (got.stdout, address.sub("0x", got.stderr)) == (
        expected.stdout, address.sub("0x", expected.stderr))


def test_a_loop_in_a_daemon_thread_still_waiting_at_exit_says_nothing(loader_name):
    """The main thread ends while a daemon thread's loop waits for a batch: torch's thread never
    wakes before the process is gone, so nothing is printed and the exit code is 0 (found by a
    sweep: stoker's woke as its worker was ended and printed its WorkerDiedError; NOTE [ A
    daemon thread's loader at exit ])."""
    expected = run_probe("torch", "_daemon_thread_at_exit_script.py")
    assert expected.stdout == "main done\n", expected.stdout
    got = run_probe(loader_name, "_daemon_thread_at_exit_script.py")
    assert (got.stdout, got.stderr) == (expected.stdout, expected.stderr)


@pytest.mark.parametrize("mode", ["ignored", "stack"])
def test_a_stream_left_early_is_closed_in_torchs_frame(loader_name, mode):
    """A persistent worker's new epoch closes the generator the loop left early in torch's
    ``_worker_loop`` frame, at its line that makes the new fetcher: Python's report of a
    generator that ignored GeneratorExit quotes that line, and a ``finally`` that reads the
    stack sees that frame (found by a sweep: stoker's lifecycle frame; NOTE [ The old
    fetcher goes ])."""
    expected = run_probe("torch", "_generator_closed_script.py", mode)
    assert "_worker_loop" in expected.stdout + expected.stderr, expected
    got = run_probe(loader_name, "_generator_closed_script.py", mode)
    address = re.compile(r"0x[0-9a-f]+")
    assert (got.stdout, address.sub("0x", got.stderr)) == (
        expected.stdout, address.sub("0x", expected.stderr))


@pytest.mark.parametrize("mode", ["live", "ended"])
def test_a_forked_copy_of_a_live_iterator_says_what_torchs_says(loader_name, mode):
    """A worker iterator left mid-epoch as cyclic garbage is copied into a forked child, whose
    collector frees the copy: torch's ``__del__`` asserts there and Python reports it on the
    child's stderr; after an epoch that ran out, nothing (found by a sweep: stoker's copy said
    nothing; NOTE [ A forked copy of a live iterator says what torch's says ])."""
    expected = run_probe("torch", "_forked_copy_script.py", mode)
    assert ("can only test a child process" in expected.stderr) == (mode == "live"), expected
    got = run_probe(loader_name, "_forked_copy_script.py", mode)
    address = re.compile(r"0x[0-9a-f]+")
    assert (got.stdout, address.sub("0x", got.stderr)) == (
        expected.stdout, address.sub("0x", expected.stderr))
