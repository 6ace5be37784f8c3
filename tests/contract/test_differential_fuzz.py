"""Differential fuzzing: hypothesis-generated user code through torch's DataLoader and stoker's,
with stoker's default arguments, compared on everything a user can observe.

Each example is a ``Case`` (``_fuzz_spec``): a dataset (torch's own classes, ``_fuzz_torch_ds``;
stoker's tar shards read by ``TarShards``, ``_fuzz_formats``; or user-style: map-style, with
``__getitems__``, or iterable; numpy/torch/Python leaves of many dtypes, mixed across samples,
aliased and viewed, in dicts, lists, tuples, namedtuples and subclasses; observations of
``get_worker_info()``, ``torch.initial_seed()``, ``random``/numpy/torch draws, the thread, the
process, attributes set by the main process and by ``worker_init_fn``; faults raising odd
exceptions), a sampler or batch sampler (torch's, or logging / stateful / reading the loop's
progress), a collate_fn, loader arguments (``num_workers`` 0-3, ``persistent_workers``,
``prefetch_factor``, ``in_order``, ``drop_last``, ``batch_size`` incl. None, ``shuffle``,
``generator``, ``timeout``, ``pin_memory``, ``multiprocessing_context``; sometimes one torch
refuses) and two epochs with reassignments between them (``worker_init_fn``, ``collate_fn``,
``generator``, ``num_workers``, and attributes torch forbids). The process the user's code
runs in is observed too (signal dispositions and masks, what a program it starts inherits,
process and thread names, ``WorkerInfo``'s type, the collector, limits, environment:
``_fuzz_env``; sometimes in a script started in the background, SIGINT, SIGQUIT and SIGHUP
ignored), and each case runs under one of four warning filters (record everything;
``error``; ``ignore`` for ``module="torch"``; Python's ``default``, once per location), so
what the loader says through ``warnings`` (category, text, the file and line it is
attributed to, how often) is compared as well.
``_fuzz_record.run_case`` runs a case through a loader class and records everything
observable as plain data; the two records must be equal, and each run must leave no
process, thread, fd or shared memory behind (the integration suite's leak check, per
example). ``faulthandler`` is off while the cases run, as in a plain script (``as_a_script``).

* ``test_stoker_matches_torch``: the bounded run in the default suite, derandomized (the same
  examples every run): ``FUZZ_EXAMPLES`` examples (about three minutes on a quiet 2-core
  machine) or ``FUZZ_BUDGET_S`` seconds, whichever ends first (``tests/_budget.py``: on a busy
  machine it checks fewer, and the run's "example budgets" summary says how many); in the fast
  tier (``scripts/test.sh --fast``, ``tests/_tiers.py``) ``FAST_FUZZ_EXAMPLES`` examples or
  ``FAST_FUZZ_BUDGET_S`` seconds. ``STOKER_FUZZ_BOUNDED_EXAMPLES`` and
  ``STOKER_FUZZ_BOUNDED_S`` override both tiers' bounds.
* ``test_stoker_matches_torch_soak``: marked ``soak`` and ``slow`` (out of the default run):
  ``pytest tests/contract/test_differential_fuzz.py -m soak``, with
  ``STOKER_FUZZ_EXAMPLES`` examples (default 3000), ``STOKER_FUZZ_SEED`` (default random)
  and a time budget ``STOKER_FUZZ_SOAK_S`` (default ``SOAK_BUDGET_PER_EXAMPLE_S`` a
  requested example). It runs hypothesis in chunks of ``SOAK_CHUNK`` examples (seeds
  ``seed * SOAK_SEED_STRIDE``, then ``+ 1``, ...: soaks run side by side with different seeds
  never check the same chunk), stops when the examples are done or the budget is spent, and
  prints how many it checked, so a long soak (20,000 examples: about an hour here) ends
  with a count, never by pytest's timeout (which would fail it with no count).
* ``test_known_difference_still_occurs``: one strict xfail per entry of
  ``_fuzz_known.KNOWN_DIFFERENCES`` (a difference found and still there, masked in the two
  runs above), on its minimal case with its own switch off: when stoker is fixed the test
  XPASSes, which fails, and says to delete the entry.

A failure prints the ``Case(...)``; to replay it outside pytest, from the repository root::

    import sys; sys.path.insert(0, "tests/contract")
    from _fuzz_spec import *; from _fuzz_record import compare_case
    print(compare_case(Case(...)))
"""

from __future__ import annotations

import faulthandler
import os
import random
import sys
import time
from collections.abc import Iterator

import pytest
from _fuzz_known import KNOWN_DIFFERENCES, UNMASK_ENV
from _fuzz_record import compare_case
from _fuzz_spec import (
    Case,
    CollateSpec,
    DatasetSpec,
    EpochSpec,
    Fault,
    Leaf,
    Node,
    Obs,
    Op,
    SamplerSpec,
    TensorSpec,
    TorchDS,
    WorkerInitSpec,
)
from _fuzz_strategies import cases
from hypothesis import HealthCheck, given, seed, settings

from _budget import ExampleBudget

try:  # where pytest keeps the stderr copy its faulthandler writes to (pytest >= 7.4)
    from _pytest.faulthandler import fault_handler_stderr_fd_key
except ImportError:  # pragma: no cover - another pytest: faulthandler is left as it is
    fault_handler_stderr_fd_key = None

BEYOND_TORCH_ENV = "STOKER_BEYOND_TORCH"  # turns on what goes beyond torch: not a default

# The leak check (tests/integration/conftest.py), as tests/contract/conftest.py loaded it.
_leak = sys.modules["_stoker_contract_leak_check"]

# In the full suite (3 pytest processes on 2 cores) the run used to end at its budget after
# 964-968 examples: 1000 keeps every one of them (derandomized: the same examples in the same
# order) and ends there, where the budget would have let it take ~250 of the suite's CPU-s.
FUZZ_EXAMPLES = 1000
FUZZ_BUDGET_S = 360.0  # ~2x the quiet machine's time: the bounded run averages ~0.15 s an example
FAST_FUZZ_EXAMPLES = 200  # the fast tier: every generator's common paths, ~30 s
FAST_FUZZ_BUDGET_S = 45.0
SHRINK_S = 600  # and hypothesis has time to shrink a failure to a small Case

SOAK_EXAMPLES = int(os.environ.get("STOKER_FUZZ_EXAMPLES", "3000"))
SOAK_SEED = os.environ.get("STOKER_FUZZ_SEED")
SOAK_BUDGET_PER_EXAMPLE_S = 0.5  # the default budget: about three times the usual time
SOAK_BUDGET_S = float(os.environ.get("STOKER_FUZZ_SOAK_S",
                                     SOAK_EXAMPLES * SOAK_BUDGET_PER_EXAMPLE_S))
SOAK_CHUNK = 250  # examples per hypothesis run: the budget is looked at between examples
SOAK_SEED_STRIDE = 1_000_003  # chunk seeds of different soak seeds stay apart
LAST_EXAMPLE_S = 300  # the example in flight when the budget ends (worker timeouts bound it)

_SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
    print_blob=True,
)


@pytest.fixture(autouse=True)
def as_a_script(request: pytest.FixtureRequest) -> Iterator[None]:
    """``faulthandler`` off while the cases run, as in ``python train.py`` (pytest turns it
    on for the session, and forked workers inherit it: a loader that turns it on in its
    workers would look like torch's). Back on afterwards, on pytest's own stderr copy."""
    if fault_handler_stderr_fd_key is None:
        yield
        return
    was = faulthandler.is_enabled()
    faulthandler.disable()
    try:
        yield
    finally:
        fd = request.config.stash.get(fault_handler_stderr_fd_key, None)
        if was and fd is not None:
            faulthandler.enable(file=fd)


def check(case: Case, loader_cls: type) -> None:
    """Run ``case`` through torch and ``loader_cls``; fail with the differences, or on a
    leak. (``loader_cls`` is the conftest's ``Loader``: with ``STOKER_TEST_LOADER=torch``
    the fuzzer compares torch with itself, which shows that the cases are deterministic.)"""
    beyond = os.environ.pop(BEYOND_TORCH_ENV, None)  # stoker's defaults, whatever the shell says
    try:
        before = _leak.snapshot()
        found = compare_case(case, lambda: _leak.wait_for_baseline(before), loader_cls)
    finally:
        if beyond is not None:
            os.environ[BEYOND_TORCH_ENV] = beyond
    # AssertionError, not pytest.fail: hypothesis then prints the falsifying Case(...).
    assert found is None, f"stoker differs from torch:\n{found}"


def _bounds(fast: bool) -> tuple[int, float]:
    """The bounded run's (examples, seconds): the tier's, or the environment's override."""
    examples, seconds = (FAST_FUZZ_EXAMPLES, FAST_FUZZ_BUDGET_S) if fast else \
        (FUZZ_EXAMPLES, FUZZ_BUDGET_S)
    examples = int(os.environ.get("STOKER_FUZZ_BOUNDED_EXAMPLES", examples))
    seconds = float(os.environ.get("STOKER_FUZZ_BOUNDED_S", seconds))
    return examples, seconds


# The budget ends the run of examples; the limit is for a hang (the example in flight when the
# budget ends is bounded by its loaders' timeouts) and the shrinking of a failure.
@pytest.mark.timeout(max(FUZZ_BUDGET_S, float(os.environ.get("STOKER_FUZZ_BOUNDED_S", 0)))
                     + LAST_EXAMPLE_S + SHRINK_S)
def test_stoker_matches_torch(Loader: type, fast_tier: bool, request: pytest.FixtureRequest,
                              capsys: pytest.CaptureFixture) -> None:
    examples, seconds = _bounds(fast_tier)
    budget = ExampleBudget("differential fuzzer", examples, seconds)

    @settings(max_examples=examples, derandomize=True, **_SETTINGS)
    @given(case=cases())
    def run(case: Case) -> None:
        budget.run(check, case, Loader)

    try:
        run()
    finally:
        budget.report(request.node)
        with capsys.disabled():
            print(f"\nfuzz: {budget.line()}", flush=True)


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.timeout(SOAK_BUDGET_S + LAST_EXAMPLE_S + SHRINK_S)
def test_stoker_matches_torch_soak(Loader: type, capsys: pytest.CaptureFixture) -> None:
    """Up to ``SOAK_EXAMPLES`` examples within ``SOAK_BUDGET_S`` (see the module doc)."""
    base_seed = int(SOAK_SEED) if SOAK_SEED is not None else random.randrange(1 << 32)
    start = time.monotonic()
    deadline = start + SOAK_BUDGET_S
    checked = 0

    def say(line: str) -> None:
        with capsys.disabled():
            print(f"\nsoak: {line}", flush=True)

    say(f"up to {SOAK_EXAMPLES} examples in {SOAK_BUDGET_S:.0f} s; STOKER_FUZZ_SEED="
        f"{base_seed} replays this soak")
    chunk = 0
    why = "a difference was found (above)"
    try:
        while checked < SOAK_EXAMPLES and time.monotonic() < deadline:
            chunk += 1

            @seed(base_seed * SOAK_SEED_STRIDE + chunk - 1)
            @settings(max_examples=min(SOAK_CHUNK, SOAK_EXAMPLES - checked),
                      derandomize=False, **_SETTINGS)
            @given(case=cases())
            def run_chunk(case: Case) -> None:
                nonlocal checked
                if time.monotonic() >= deadline:
                    return  # the budget is spent: the rest of this chunk is generated only
                checked += 1
                check(case, Loader)

            run_chunk()
        why = "all done" if checked >= SOAK_EXAMPLES else "the time budget ran out"
    finally:
        say(f"{checked} of {SOAK_EXAMPLES} examples checked in {time.monotonic() - start:.0f} "
            f"s ({chunk} chunk(s) from seed {base_seed}; {why})")


# --------------------------------------------------------------------------------------------
# Known differences: each one's minimal case, run with its own switch off
# --------------------------------------------------------------------------------------------

_INT = Leaf("int")
_ONE_EPOCH = (EpochSpec(),)
_WORKERS = (("batch_size", 2), ("num_workers", 2), ("timeout", 30.0))


def _map(tree: object = _INT, n: int = 4, fault: Fault | None = None) -> DatasetSpec:
    return DatasetSpec("map", n, tree, fault)


MINIMAL_CASES: dict[str, Case] = {
    "worker_exceptions": Case(_map(fault=Fault(1, "coded")), _WORKERS, _ONE_EPOCH),
    "exception_notes": Case(_map(fault=Fault(1, "value")), (("batch_size", 2),), _ONE_EPOCH),
    "stop_iteration_in_map_style": Case(_map(fault=Fault(3, "stop")), (("batch_size", 2),),
                                        _ONE_EPOCH),
}

# Differences the fuzzer found and that are fixed: each one's minimal case, run in full.
FIXED_CASES: dict[str, Case] = {
    # num_workers raised from 0 after the constructor (prefetch_factor left None): torch's
    # TypeError compares with '<=', stoker's compared with '>'
    "num_workers_raised_later": Case(
        _map(), (), (EpochSpec(), EpochSpec(ops=(Op("num_workers", 1),)))
    ),
    # timeout>0 with num_workers=0: stoker raised before drawing the base seed (the main
    # process's torch RNG then differed) and with its own message, before the pin_memory
    # warning; now torch's AssertionError where torch raises it, the advice as a note
    "timeout_without_workers": Case(_map(), (("timeout", 5.0),), _ONE_EPOCH),
    # after worker_init_fn raised, that worker's later batches raised its error again, where
    # torch's raise UnboundLocalError (NOTE [ After worker_init_fn raised ])
    "worker_init_error_repeats": Case(
        _map(n=6),
        _WORKERS + (("worker_init_fn", WorkerInitSpec(fault_worker=0)),),
        (EpochSpec(continue_on_error=True),),
    ),
    # stoker's workers turned faulthandler on where the parent had it off (issue 44's one
    # trace, removed: NOTE [ faulthandler as the parent left it ])
    "worker_faulthandler": Case(_map(Obs(("rt", "sig")), n=2), _WORKERS, _ONE_EPOCH),
    # SIGRTMAX-2 was caught in every stoker worker (stacks on request); now only while the
    # doctor samples: NOTE [ Stacks on request ]
    "worker_stack_signal": Case(_map(Obs(("sig",)), n=2), _WORKERS, _ONE_EPOCH),
    "prefetch_factor_zero_calls_len_once": Case(  # torch checks between its two iter(sampler)
        DatasetSpec("map", 1, Leaf("np", "float32", ())),
        (("batch_size", None), ("num_workers", 1), ("timeout", 30.0), ("prefetch_factor", 0)),
        (EpochSpec(), EpochSpec()),
    ),
    "is_shared": Case(_map(), _WORKERS, _ONE_EPOCH),
    "layout_through_workers": Case(
        _map(Leaf("torch", "float32", (3,), "view")), _WORKERS[1:] + (("batch_size", None),),
        _ONE_EPOCH,
    ),
    "stop_iteration_in_worker_collate": Case(
        DatasetSpec("iter", 12, _INT, split="shard"),
        (("batch_size", 1), ("num_workers", 2), ("timeout", 30.0),
         ("collate_fn", CollateSpec("default", fault=Fault(2, "stop", worker=0)))),
        _ONE_EPOCH,
    ),
    "collate_type_error_retry": Case(
        _map(Node("list", (Leaf("int", alt=Leaf("np", "float32", (3, 2))),)), n=7),
        (("batch_size", 5),), _ONE_EPOCH,
    ),
    "aliasing_across_workers": Case(
        _map(Leaf("torch", "float32", (3,))),
        _WORKERS + (("collate_fn", CollateSpec("default", alias=True)),),
        _ONE_EPOCH,
    ),
    # The process and the voice (issue 44): under simplefilter("error") torch says nothing at
    # iter() of a dataset holding a numpy Generator (stoker's advice is not a warning) ...
    "error_filter_at_iter_numpy_generator": Case(
        DatasetSpec("map", 4, _INT, gen=True), _WORKERS, _ONE_EPOCH, warn="error"),
    # ... the pin_memory warning is attributed to torch's module, so module="torch" hides it
    # (without workers, and with them: attributed at each iterator's super().__init__) ...
    "ignore_torch_pin_memory": Case(_map(), (("pin_memory", True),), _ONE_EPOCH,
                                    warn="ignore_torch"),
    "pin_memory_warning_with_workers": Case(_map(), _WORKERS + (("pin_memory", True),),
                                            (EpochSpec(), EpochSpec())),
    # ... more workers than CPUs (this machine has 2): at construction and at iter() ...
    "error_filter_more_workers_than_cpus": Case(
        _map(), (("num_workers", 3), ("timeout", 30.0)), _ONE_EPOCH, warn="error"),
    # ... under the default filter, once per location: torch's pin_memory warning is not shown
    # again at the second epoch's iter() (the same line of torch's, the same registry) ...
    "default_filter_pin_memory_twice": Case(
        _map(), (("pin_memory", True),), (EpochSpec(), EpochSpec()), warn="default"),
    # ... an IterableDataset longer than its __len__: attributed to the loop calling next().
    "iterable_longer_than_len": Case(
        DatasetSpec("iter", 4, _INT, length="lie"), (("num_workers", 1), ("timeout", 30.0)),
        _ONE_EPOCH, len_first=True),
    # The worker's process: SIGINT as a program it starts inherits it, its process name
    # (Process-N, numbered as torch numbers it) and comm (pt_data_worker), WorkerInfo's type.
    "child_sees_worker_sigint": Case(_map(Obs(("child",)), n=2), _WORKERS, _ONE_EPOCH),
    "child_of_a_background_job": Case(_map(Obs(("child", "sig")), n=2), _WORKERS, _ONE_EPOCH,
                                      started="background"),
    "worker_process_name_and_comm": Case(_map(Obs(("proc", "names"))), _WORKERS,
                                         (EpochSpec(), EpochSpec())),
    "worker_info_type": Case(_map(Obs(("info",))), _WORKERS, _ONE_EPOCH),
    # iter() raising once the workers are up (a sampler raising in the first prefetch): torch
    # has set its SIGCHLD handler in the main process by then, and workers forked later
    # inherit it (found by the main process's signals in the record).
    "sigchld_after_failed_start": Case(
        _map(n=6), _WORKERS + (("sampler", SamplerSpec("raising")),), _ONE_EPOCH),
    # stoker's advice printed nothing through ``warnings`` but reached stderr through
    # logging.lastResort (a WARNING on a logger with no handler), or showed at INFO under
    # basicConfig(level=INFO): a generator every worker copies, a dataset batched as
    # gathers. Now at DEBUG and in stats().advice: NOTE [ Advice is quiet ].
    "advice_on_a_copied_generator_is_quiet": Case(
        DatasetSpec("map", 4, _INT, gen=True), _WORKERS, _ONE_EPOCH),
    "fast_path_note_is_quiet": Case(
        DatasetSpec("torch", 6, _INT, torch_ds=TorchDS("tensors", 6, (TensorSpec("float32"),))),
        _WORKERS, _ONE_EPOCH),
    # torch's persistent workers read a tensor in shared memory live: the rows written between
    # the epochs show in the second; the main process's gathers from the workers' starting
    # copy gave the first epoch's rows again (NOTE [ Memory a fork copies ]).
    **{f"written_between_epochs_{layout}": Case(
        DatasetSpec("torch", 6, _INT, torch_ds=TorchDS(
            "tensors", 6, (TensorSpec("float32", (2,), layout), TensorSpec("int64")))),
        _WORKERS + (("persistent_workers", True),),
        (EpochSpec(), EpochSpec(ops=(Op("write_tables"),))))
       for layout in ("plain", "shared", "mapped")},
    # torch's code patched by the program between epochs (``functools.wraps`` wrappers): torch
    # calls the program's version; stoker's fast paths (the sampler's slices of randperm, the
    # gathers of torch's classes) ran torch's own (NOTE [ torch's own functions ]).
    **{f"patched_between_epochs_{name}_{workers}": Case(
        DatasetSpec("torch", 6, _INT, torch_ds=TorchDS(
            "tensors", 6, (TensorSpec("float32", (2,)), TensorSpec("int64")))),
        (("batch_size", 2), ("shuffle", True), ("num_workers", workers))
        + ((("timeout", 30.0),) if workers else ()),
        (EpochSpec(), EpochSpec(ops=(Op("patch_torch", name),))))
       for name in ("RandomSampler.__iter__", "BatchSampler.__iter__",
                    "TensorDataset.__getitem__", "torch.stack", "torch.index_select")
       for workers in (0, 2)},
    # a torch mode active while the program iterates saw stoker's own calls (statistics, RNG
    # copies, the sampler's randperm(...).numpy()) and missed torch's profiler range
    # (NOTE [ The program's torch modes see torch's calls ]).
    **{f"iterated_inside_a_{kind}_mode_{workers}": Case(
        DatasetSpec("torch", 6, _INT, torch_ds=TorchDS(
            "tensors", 6, (TensorSpec("float32", (2,)), TensorSpec("int64")))),
        (("batch_size", 2), ("shuffle", True), ("num_workers", workers))
        + ((("timeout", 30.0),) if workers else ()),
        (EpochSpec(ops=(Op("torch_mode", kind),)),))
       for kind in ("function", "dispatch") for workers in (0, 2)},
    # a forked worker's first task went before the next fork whatever the sampler: the second
    # worker saw how far a program's sampler had run, or the loader's generator after the
    # shuffle's draw; torch forks every worker first (NOTE [ Tasks before the next fork ]).
    "a_later_worker_saw_the_samplers_draws": Case(
        _map(Obs(("drawn",)), n=6), _WORKERS + (("sampler", SamplerSpec("stateful")),),
        (EpochSpec(), EpochSpec())),
    "a_later_worker_saw_the_generators_draws": Case(
        _map(Obs(("lgen",)), n=6), _WORKERS + (("shuffle", True), ("generator", 5)),
        (EpochSpec(), EpochSpec())),
}


def test_every_known_difference_has_a_minimal_case() -> None:
    assert sorted(MINIMAL_CASES) == sorted(KNOWN_DIFFERENCES)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(
            strict=True, raises=AssertionError, reason=KNOWN_DIFFERENCES[name]))
        for name in sorted(MINIMAL_CASES) if name in KNOWN_DIFFERENCES
    ],
)
def test_known_difference_still_occurs(
    name: str, Loader: type, stoker_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XPASS (a failure, strict) means stoker now matches torch here: delete the entry from
    ``_fuzz_known.KNOWN_DIFFERENCES`` so the fuzzer generates the feature again. Only this
    entry's switch is off, so the case fails on this difference alone."""
    monkeypatch.setenv(UNMASK_ENV, name)
    check(MINIMAL_CASES[name], Loader)


@pytest.mark.parametrize("name", sorted(FIXED_CASES))
def test_fixed_difference_stays_fixed(name: str, Loader: type) -> None:
    """A difference the fuzzer found (``FIXED_CASES``), on its minimal case: stoker's
    defaults give what torch gives."""
    check(FIXED_CASES[name], Loader)
