"""Differential fuzzing: hypothesis-generated user code through torch's DataLoader and stoker's,
with stoker's default arguments, compared on everything a user can observe.

Each example is a ``Case`` (``_fuzz_spec``): a user-style dataset (map-style, with
``__getitems__``, or iterable; numpy/torch/Python leaves of many dtypes, mixed across samples,
aliased and viewed, in dicts, lists, tuples, namedtuples and subclasses; observations of
``get_worker_info()``, ``torch.initial_seed()``, ``random``/numpy/torch draws, the thread, the
process, attributes set by the main process and by ``worker_init_fn``; faults raising odd
exceptions), a sampler or batch sampler (torch's, or logging / stateful / reading the loop's
progress), a collate_fn, loader arguments (``num_workers`` 0-3, ``persistent_workers``,
``prefetch_factor``, ``in_order``, ``drop_last``, ``batch_size`` incl. None, ``shuffle``,
``generator``, ``timeout``, ``pin_memory``; sometimes one torch refuses) and two epochs with
reassignments between them (``worker_init_fn``, ``collate_fn``, ``generator``,
``num_workers``, and attributes torch forbids). ``_fuzz_record.run_case`` runs it through a
loader class and records everything observable as plain data; the two records must be equal,
and each run must leave no process, thread, fd or shared memory behind (the integration
suite's leak check, per example).

* ``test_stoker_matches_torch``: the bounded run in the default suite, derandomized (the same
  examples every run), ``FUZZ_EXAMPLES`` examples (about two minutes on a 2-core machine).
* ``test_stoker_matches_torch_soak``: marked ``soak`` and ``slow`` (out of the default run):
  ``pytest tests/contract/test_differential_fuzz.py -m soak``, with
  ``STOKER_FUZZ_EXAMPLES`` examples (default 3000) and ``STOKER_FUZZ_SEED`` (default random).
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

import os
import sys
from typing import Any

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
    Op,
    WorkerInitSpec,
)
from _fuzz_strategies import cases
from hypothesis import HealthCheck, given, seed, settings

BEYOND_TORCH_ENV = "STOKER_BEYOND_TORCH"  # turns on what goes beyond torch: not a default

# The leak check (tests/integration/conftest.py), as tests/contract/conftest.py loaded it.
_leak = sys.modules["_stoker_contract_leak_check"]

FUZZ_EXAMPLES = 1200
SOAK_EXAMPLES = int(os.environ.get("STOKER_FUZZ_EXAMPLES", "3000"))
SOAK_SEED = os.environ.get("STOKER_FUZZ_SEED")
PER_EXAMPLE_S = 0.5  # a hang still ends the test: the bounded run averages ~0.1 s an example
SHRINK_S = 600  # and hypothesis has time to shrink a failure to a small Case

_SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
    print_blob=True,
)


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


@pytest.mark.timeout(FUZZ_EXAMPLES * PER_EXAMPLE_S + SHRINK_S)
@settings(max_examples=FUZZ_EXAMPLES, derandomize=True, **_SETTINGS)
@given(case=cases())
def test_stoker_matches_torch(Loader: type, case: Case) -> None:
    check(case, Loader)


def _seeded(test: Any) -> Any:
    return test if SOAK_SEED is None else seed(int(SOAK_SEED))(test)


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.timeout(SOAK_EXAMPLES * PER_EXAMPLE_S + SHRINK_S)
@_seeded
@settings(max_examples=SOAK_EXAMPLES, derandomize=False, **_SETTINGS)
@given(case=cases())
def test_stoker_matches_torch_soak(Loader: type, case: Case) -> None:
    check(case, Loader)


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
    "worker_init_error_repeats": Case(
        _map(n=6),
        _WORKERS + (("worker_init_fn", WorkerInitSpec(fault_worker=0)),),
        (EpochSpec(continue_on_error=True),),
    ),
    "exception_notes": Case(_map(fault=Fault(1, "value")), (("batch_size", 2),), _ONE_EPOCH),
    "timeout_without_workers": Case(_map(), (("timeout", 5.0),), _ONE_EPOCH),
    "stop_iteration_in_map_style": Case(_map(fault=Fault(3, "stop")), (("batch_size", 2),),
                                        _ONE_EPOCH),
    "num_workers_raised_later": Case(
        _map(), (), (EpochSpec(), EpochSpec(ops=(Op("num_workers", 1),)))
    ),
}

# Differences the fuzzer found and that are fixed: each one's minimal case, run in full.
FIXED_CASES: dict[str, Case] = {
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
