"""Random nested sample structures collate through the loader exactly like torch's collate.

The unit property tests (``tests/unit/test_collate_hypothesis.py``) call stoker's
``default_collate`` directly. These run the same random structures through a real loader, on
the inline path (``num_workers=0``) and the worker path (``num_workers=2``: collate into a
shared-memory slab, pack, send a descriptor, rebuild over a lease in the main process), and
compare every batch with ``torch.utils.data.default_collate`` of the same samples (on the
worker path, as it runs in torch's workers, with ``get_worker_info()`` set): types,
container and namedtuple types, dtypes, shapes, values (bit for bit), strings. A batch torch
cannot collate must make the loader raise the same exception type, with the same message, at
that batch. With ``STOKER_TEST_LOADER=torch`` only the inline path runs: torch's own workers
rebuild errors around a rewritten message (see ``test_worker_path_collates_like_torch``).

Starting workers for every Hypothesis example would be too slow, so one example is a list of
*groups* (each group is one batch from the unit tests' ``batches()`` strategy) and runs one
loader over all of them: the dataset is every sample of every group laid end to end, and a
batch sampler yields one batch per group. An exception ends an epoch, so the groups that torch
collates come first, in one epoch that ends with the first failing group; each further failing
group gets an epoch of its own (``persistent_workers=True`` keeps those epochs cheap). 50
examples per path take about 10 s on 2 cores.
"""

from __future__ import annotations

import collections
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
from _datasets import EpochPlan, drop_tracebacks
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st


def _import_unit_module(name: str) -> Any:
    """A module of ``tests/unit`` (its strategies and helpers are reused, not copied).

    pytest puts ``tests/unit`` on ``sys.path`` only once it collects a test there, which may be
    after this module (or never, when only ``tests/integration`` runs).
    """
    unit_dir = str(Path(__file__).resolve().parent.parent / "unit")
    if unit_dir not in sys.path:
        sys.path.insert(0, unit_dir)
    return importlib.import_module(name)


_hyp = _import_unit_module("test_collate_hypothesis")
_unit = _import_unit_module("test_collate")

# Odd batches make torch (and so us) warn, e.g. about indexing a tensor with a list.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    # stoker_only (function-scoped) only decides whether the test runs: sharing it across
    # examples is what we want.
    suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
    ],
)
MAX_GROUPS = 6
# Examples are bounded by time too (tests/_budget.py): 50 take ~10 s a path on a quiet 2-core
# machine; on a busy one the test checks what fits and the run's summary says how many.
BUDGET_S = 45.0

# The unit strategies build namedtuples kept in a dict (``NAMEDTUPLES``), which pickle cannot
# find by name; a batch that crosses from a worker must pickle its containers, so every sample
# is rebuilt with these module-level twins (same field names, found as
# ``<this module>.NT<n>``). The structure is otherwise unchanged.
NT0 = collections.namedtuple("NT0", [])
NT1 = collections.namedtuple("NT1", ["a"])
NT2 = collections.namedtuple("NT2", ["a", "b"])
NT3 = collections.namedtuple("NT3", ["a", "b", "c"])
_PORTABLE = {_hyp.NAMEDTUPLES[n]: nt for n, nt in enumerate((NT0, NT1, NT2, NT3))}


def portable(sample: Any) -> Any:
    """``sample`` with the unit strategies' namedtuples swapped for picklable ones."""
    if type(sample) in _PORTABLE:
        return _PORTABLE[type(sample)](*(portable(x) for x in sample))
    if type(sample) is dict:
        return {key: portable(value) for key, value in sample.items()}
    if type(sample) is list:
        return [portable(x) for x in sample]
    if type(sample) is tuple:
        return tuple(portable(x) for x in sample)
    return sample


groups_strategy = st.lists(_hyp.batches().map(lambda batch: [portable(s) for s in batch]),
                           min_size=2, max_size=MAX_GROUPS)


class GroupsDataset(torch.utils.data.Dataset):
    """Every sample of every group, end to end; ``spans[g]`` are group ``g``'s indices."""

    def __init__(self, groups: Sequence[list[Any]]) -> None:
        self.samples = [sample for group in groups for sample in group]
        self.spans: list[list[int]] = []
        start = 0
        for group in groups:
            self.spans.append(list(range(start, start + len(group))))
            start += len(group)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.samples[i]




def torch_outcome(group: list[Any]) -> tuple[str, Any]:
    return _unit.outcome(lambda: torch.utils.data.default_collate(group))


def torch_worker_outcome(group: list[Any]) -> tuple[str, Any]:
    """``torch_outcome`` as torch's collate runs inside a worker (``get_worker_info()`` set):
    tensors stacked with ``out=`` shaped and typed like the first sample."""
    from torch.utils.data._utils import worker as torch_worker

    saved = torch_worker._worker_info
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=0, num_workers=1, seed=0, dataset=None
    )
    try:
        return torch_outcome(group)
    finally:
        torch_worker._worker_info = saved


def check_error(ours: BaseException, theirs: BaseException, g: int) -> None:
    assert type(ours) is type(theirs), (
        f"group {g}: the loader raised {type(ours).__name__}: {ours}; "
        f"torch's default_collate raised {type(theirs).__name__}: {theirs}"
    )
    assert str(ours) == str(theirs), f"group {g}"


def run_groups(Loader: type, groups: list[list[Any]], num_workers: int) -> tuple[int, int]:
    """Check every group's batch (or error); return how many groups collate and raise."""
    dataset = GroupsDataset(groups)
    reference = torch_worker_outcome if num_workers else torch_outcome
    outcomes = [reference(group) for group in groups]
    good = [g for g, (kind, _) in enumerate(outcomes) if kind == "ok"]
    bad = [g for g, (kind, _) in enumerate(outcomes) if kind == "raised"]
    # Epoch 1: every group torch collates, then the first failing one; then one epoch per
    # further failing group.
    epochs = [good + bad[:1]] + [[g] for g in bad[1:]]
    plan = EpochPlan()
    loader = Loader(
        dataset, batch_sampler=plan, num_workers=num_workers,
        persistent_workers=num_workers > 0, timeout=60 if num_workers else 0,
        # A list dataset could run inline (NOTE [ Gathers need no workers ]): test workers.
        **({"worker_type": "process"} if num_workers else {}),
    )
    for epoch in epochs:
        plan.plan([dataset.spans[g] for g in epoch])
        it = iter(loader)
        for g in epoch:
            kind, expected = outcomes[g]
            if kind == "ok":
                batch = next(it)
                _unit.assert_same(batch, expected, path=f"group {g}")
                del batch
                continue
            with pytest.raises(Exception) as info:  # noqa: B017 (the type is checked below)
                next(it)
            error = info.value
            del info
            check_error(error, expected, g)
            drop_tracebacks(error)
            drop_tracebacks(expected)
            break
        else:
            with pytest.raises(StopIteration):
                next(it)
        del it
    del loader
    return len(good), len(bad)


# Empty tensors of the unsigned dtypes torch added late (uint16/32/64) cannot be unpickled by
# torch 2.13; the transport sends every empty tensor as a descriptor instead.
@pytest.mark.parametrize(
    "sample",
    [
        np.array([], dtype=np.uint16),
        torch.empty((2, 0), dtype=torch.uint64),
        {"a": np.zeros(3, dtype=np.float32), "b": np.array([], dtype=np.uint32)},
    ],
    ids=["ndarray-uint16", "tensor-uint64", "dict-with-uint32"],
)
def test_empty_unsigned_tensors_cross_from_workers(Loader, stoker_only, sample):
    run_groups(Loader, [[sample, sample]], num_workers=2)


# Examples Hypothesis always runs: a bad group torch's own workers fail on differently (see
# the worker test), strings passed through as a list, module-level namedtuples, a dict batch.
EXAMPLES = [
    [[torch.tensor(0.0), [torch.tensor(0.0)]]],
    [["a", "bc"], [NT2(torch.ones(2), "x"), NT2(torch.zeros(2), "y")]],
    [[{"a": np.arange(3), "b": 1.5}, {"a": np.arange(3, 6), "b": -2.0}], [(1, b"x")]],
]


def check_groups(Loader: type, groups: list[list[Any]], num_workers: int) -> None:
    collated, raised = run_groups(Loader, groups, num_workers)
    event(f"{collated} groups collate, {raised} raise")


def budget(example_budget: Any, path: str) -> Any:
    return example_budget(f"collate through the {path} path",
                          SETTINGS.max_examples + len(EXAMPLES), BUDGET_S)


@SETTINGS
@given(groups=groups_strategy)
@example(groups=EXAMPLES[0])
@example(groups=EXAMPLES[1])
@example(groups=EXAMPLES[2])
def test_inline_path_collates_like_torch(Loader, example_budget, groups):
    budget(example_budget, "inline").run(check_groups, Loader, groups, num_workers=0)


@SETTINGS
@given(groups=groups_strategy)
@example(groups=EXAMPLES[0])
@example(groups=EXAMPLES[1])
@example(groups=EXAMPLES[2])
def test_worker_path_collates_like_torch(Loader, stoker_only, example_budget, groups):
    """stoker-only: torch's own workers rebuild errors around a rewritten message.

    In a worker, torch stacks tensors into shared memory with ``out=`` of the first sample's
    dtype (so ``[float32, float64]`` gives float32, not float64, and ``[int8, float32]`` raises
    TypeError) and fails differently on some bad batches (AttributeError instead of TypeError
    for a tensor batch holding a list): stoker's workers give that batch, or that exception
    type and message (``default_collate`` run with ``get_worker_info()`` set), NOTE [ Collate
    in a worker is torch's in-worker collate ].
    """
    budget(example_budget, "worker").run(check_groups, Loader, groups, num_workers=2)


class _Images(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        hwc = torch.arange(i, i + 48 * 32 * 3).remainder(256).to(torch.uint8).reshape(48, 32, 3)
        return hwc.permute(2, 0, 1), i


def _wraps_torchs_default_collate(batch):
    images, labels = torch.utils.data.default_collate(batch)
    # Where torch's collate put the images: in a worker, torch allocates a shared segment.
    return {"x": images, "y": labels, "shared": torch.tensor(images.is_shared())}


def test_a_collate_fn_calling_torchs_default_collate_runs_torchs_in_workers(Loader):
    # By default torch's own function runs in the worker: its outputs in shared memory.
    kwargs = {"batch_size": 4, "num_workers": 2, "collate_fn": _wraps_torchs_default_collate}
    ours = list(Loader(_Images(), timeout=60, **kwargs))
    theirs = list(torch.utils.data.DataLoader(_Images(), timeout=60, **kwargs))
    assert [bool(b["shared"]) for b in theirs] == [True] * 3
    assert [bool(a["shared"]) for a in ours] == [True] * 3
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a["x"], b["x"]) and a["x"].dtype == b["x"].dtype


def test_a_collate_fn_calling_torchs_default_collate_writes_into_the_slab(Loader, stoker_only):
    # NOTE [ torch's collate in stoker workers ]: with slab_transport, same batches as torch's
    # workers give, without a shared-memory segment of torch's per batch.
    kwargs = {"batch_size": 4, "num_workers": 2, "collate_fn": _wraps_torchs_default_collate}
    ours = list(Loader(_Images(), timeout=60, worker_type="process",
                       beyond_torch={"slab_transport"}, **kwargs))
    theirs = list(torch.utils.data.DataLoader(_Images(), timeout=60, **kwargs))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a["x"], b["x"]) and a["x"].dtype == b["x"].dtype
        assert torch.equal(a["y"], b["y"])
        assert bool(b["shared"]) and not bool(a["shared"])
    # the user's own process keeps torch's stock map
    from torch.utils.data._utils import collate as torch_collate

    assert torch_collate.default_collate_fn_map[torch.Tensor] is torch_collate.collate_tensor_fn
