"""``assert_resumes_exactly`` over the loader's configuration matrix.

Every dataset here draws from ``random``, numpy's global RNG and torch's global RNG in
``__getitem__``/``__iter__``, so the batches also check that per-batch seeding makes
augmentations depend only on (base seed, epoch, batch position): the same after a resume, and
the same for any ``num_workers``.

Workers are used sparingly (each resume starts them again): configurations with workers check a
handful of save points (``steps=4..5``, always including step 0, the end of the first epoch and
the last batch); ``num_workers=0`` configurations check every step.

``in_order=False``
    Batches are yielded in completion order, which is not reproducible run to run even without
    a resume, so no concatenation can equal the reference in order. What the loader promises is
    that the state records exactly which positions were delivered (a contiguous prefix plus
    the out-of-order extras), so after a resume the remaining batches of the epoch are exactly
    the epoch's batches not yet received: no batch lost, none repeated, each with the contents
    and augmentations it has in an uninterrupted run. ``same_batches_any_order`` checks exactly
    that, per epoch: the batches received before the save plus those after it equal the
    reference epoch as a multiset of whole batches (sorted by a digest of their content). Epoch
    boundaries stay strict.

``generator=None``
    The epoch's order and the base seed come from torch's global RNG, which the user's own
    code also draws from, so "exact" needs a reference point. The promise tested here: the
    state holds the global RNG at the start of the saved epoch (the rest of that epoch is
    recomputed from it) and at the save point; after a resume the global RNG is left at the
    save point, as the uninterrupted run had it, so every later epoch's order and base seed
    match too. The loaders are built after ``torch.manual_seed`` so that the reference and the
    saving run start alike; a training checkpoint that restores ``torch.get_rng_state()``
    itself (``GlobalRngCheckpoint``) must agree with the loader's own restore.
"""

from __future__ import annotations

import base64
import functools
import random
import re
import time
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    Dataset,
    IterableDataset,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    get_worker_info,
)

import stoker
from stoker.distributed import shard_iterable
from stoker.engine import base_iter
from stoker.testing import (
    ResumeCheck,
    assert_resumes_exactly,
    same_batches,
    same_batches_any_order,
)

N = 13  # samples: prime, so no batch size divides it


def _draws(i: int) -> dict[str, Any]:
    return {"index": i, "py": random.random(), "np": np.random.rand(), "torch": torch.rand(2)}


class Augmented(Dataset):
    """Sample ``i``: its index and one draw from each global RNG (a random augmentation)."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _draws(i)


class SlowOnWorker0(Augmented):
    """Worker 0 is slower, so with ``in_order=False`` batches overtake each other."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = get_worker_info()
        if info is not None and info.id == 0:
            time.sleep(0.005)  # only perturbs the arrival order; nothing depends on timing
        return _draws(i)


class AugmentedStream(IterableDataset):
    """An IterableDataset that shards itself across workers (and ranks)."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __iter__(self) -> Any:
        for i in shard_iterable(range(self.n)):
            yield _draws(i)


class ResumableSampler(Sampler[int]):
    """A shuffling sampler with its own position state (torchdata's stateful convention)."""

    def __init__(self, n: int, seed: int = 7) -> None:
        self.n, self.seed, self.epoch = n, seed, 0
        self.yielded = 0
        self._start = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        order = torch.randperm(self.n, generator=generator).tolist()
        start, self._start = self._start, 0
        self.yielded = start
        for index in order[start:]:
            self.yielded += 1
            yield index

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self._start = state["epoch"], state["yielded"]


class RandomSizeBatches(Sampler[list[int]]):
    """A custom batch_sampler: random order, random batch sizes, from its own generator."""

    def __init__(self, n: int, seed: int = 11) -> None:
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Any:
        order = torch.randperm(self.n, generator=self.generator).tolist()
        start = 0
        while start < self.n:
            size = int(torch.randint(1, 5, (1,), generator=self.generator))
            yield order[start : start + size]
            start += size


class GlobalRngCheckpoint(stoker.DataLoader):
    """A full training checkpoint: the loader's state plus torch's global RNG, restored together."""

    def state_dict(self) -> dict[str, Any]:
        rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")
        return {**super().state_dict(), "torch_rng": rng}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        raw = bytearray(base64.b64decode(state.pop("torch_rng")))
        torch.set_rng_state(torch.frombuffer(raw, dtype=torch.uint8).clone())
        super().load_state_dict(state)


def build(
    num_workers: int = 0, *, dataset: Any = None, n: int = N, seed: int | None = 3,
    loader_cls: type = stoker.DataLoader, **kwargs: Any,
) -> Any:
    """A loader over a fresh dataset; ``seed=None`` means ``generator=None`` (global RNG)."""
    if seed is None:
        torch.manual_seed(1234)  # the shuffle and the base seed come from the global RNG
        generator = None
    else:
        generator = torch.Generator().manual_seed(seed)
    ds = Augmented(n) if dataset is None else dataset
    return loader_cls(ds, num_workers=num_workers, generator=generator, **kwargs)


def loaders(**kwargs: Any) -> Any:
    return functools.partial(build, **kwargs)


# -- map-style, num_workers=0: every step -----------------------------------------------------

MAP_CASES = [
    (shuffle, drop_last, batch_size)
    for shuffle in (True, False)
    for batch_size in (None, 1, 5)
    for drop_last in (False, True)
    if not (batch_size is None and drop_last)  # torch forbids drop_last without batching
]


@pytest.mark.parametrize(("shuffle", "drop_last", "batch_size"), MAP_CASES)
def test_map_style_every_step(shuffle: bool, drop_last: bool, batch_size: int | None) -> None:
    check = assert_resumes_exactly(
        loaders(shuffle=shuffle, drop_last=drop_last, batch_size=batch_size), epochs=2
    )
    per_epoch = N if batch_size in (None, 1) else (N // 5 if drop_last else -(-N // 5))
    assert check.epoch_lengths == (per_epoch, per_epoch)
    assert check.steps == tuple(range(2 * per_epoch + 1))


def test_three_epochs_odd_size() -> None:
    assert_resumes_exactly(loaders(n=23, shuffle=True, batch_size=4), epochs=3)


def test_per_worker_seeding_resumes_with_workers_off() -> None:
    # seeding="per_worker" with num_workers=0: the dataset draws from the caller's global RNGs.
    # Those advance as the run goes, so only the order (not the augmentation) is resumable;
    # here the dataset draws nothing, to check the order alone.
    assert_resumes_exactly(
        loaders(dataset=torch.arange(N), shuffle=True, batch_size=3, seeding="per_worker")
    )


# -- map-style with workers ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("shuffle", "batch_size", "drop_last"),
    [(True, 5, False), (False, None, False), (True, 4, True)],
)
def test_map_style_two_workers(shuffle: bool, batch_size: int | None, drop_last: bool) -> None:
    assert_resumes_exactly(
        loaders(num_workers=2, shuffle=shuffle, batch_size=batch_size, drop_last=drop_last),
        steps=5,
    )


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0), (2, 1)])
def test_resume_with_different_num_workers(before: int, after: int) -> None:
    assert_resumes_exactly(
        loaders(num_workers=before, shuffle=True, batch_size=3),
        resume_loader=loaders(num_workers=after, shuffle=True, batch_size=3),
        steps=4,
    )


def test_out_of_order_delivery() -> None:
    assert_resumes_exactly(
        loaders(num_workers=2, dataset=SlowOnWorker0(), shuffle=True, batch_size=2,
                in_order=False),
        steps=None, compare=same_batches_any_order,  # every step: some states hold extras
    )


def test_persistent_workers() -> None:
    assert_resumes_exactly(
        loaders(num_workers=2, shuffle=True, batch_size=3, persistent_workers=True),
        epochs=3, steps=5,
    )


# -- generator=None: torch's global RNG ------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_global_rng(num_workers: int) -> None:
    assert_resumes_exactly(
        loaders(num_workers=num_workers, seed=None, shuffle=True, batch_size=5),
        epochs=3, steps=None if num_workers == 0 else 5,
    )


def test_global_rng_with_a_full_checkpoint() -> None:
    # The training checkpoint restores torch's global RNG too, before load_state_dict: the
    # loader's own restore must agree with it.
    assert_resumes_exactly(
        loaders(seed=None, shuffle=True, batch_size=5, loader_cls=GlobalRngCheckpoint),
        epochs=3,
    )


def test_global_rng_resumed_run_continues_the_callers_stream() -> None:
    # After a resume, torch's global RNG is where the uninterrupted run had it at the save
    # point, whatever the resumed process did to it before load_state_dict.
    reference = build(seed=None, shuffle=True, batch_size=5)
    it = iter(reference)
    next(it)
    state = reference.state_dict()
    expected = torch.rand(3)  # the caller's next draw in the uninterrupted run
    resumed = build(seed=None, shuffle=True, batch_size=5)
    torch.manual_seed(99)  # the resumed process drew something else meanwhile
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert torch.equal(torch.rand(3), expected)


# -- samplers --------------------------------------------------------------------------------

def test_subset_random_sampler() -> None:
    def make() -> Any:
        sampler = SubsetRandomSampler(range(1, N, 2), generator=torch.Generator().manual_seed(5))
        return build(sampler=sampler, batch_size=2)

    assert_resumes_exactly(make)


def test_weighted_random_sampler() -> None:
    def make() -> Any:
        sampler = WeightedRandomSampler(
            [float(i + 1) for i in range(N)], num_samples=17, replacement=True,
            generator=torch.Generator().manual_seed(6),
        )
        return build(sampler=sampler, batch_size=3)

    assert_resumes_exactly(make)


def test_custom_batch_sampler() -> None:
    check = assert_resumes_exactly(
        lambda: build(batch_sampler=RandomSizeBatches(N)), epochs=3
    )
    assert len(set(check.epoch_lengths)) > 1, "the batch sizes should differ between epochs"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_with_its_own_state(num_workers: int) -> None:
    # Its epoch is advanced by the loader's epoch autopilot (it has set_epoch and ``epoch``),
    # so a state saved after an epoch's loop ended must carry the *next* epoch.
    assert_resumes_exactly(
        lambda: build(num_workers, sampler=ResumableSampler(N), batch_size=3),
        epochs=3, steps=None if num_workers == 0 else 5,
    )


# -- IterableDataset -------------------------------------------------------------------------

_FAST_FORWARD = re.escape("Resuming AugmentedStream (an IterableDataset) by reading its first ")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset(num_workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The warning is given once per dataset object, remembered by id(); a fresh registry keeps
    # an id reused from an earlier test's dataset from hiding it.
    monkeypatch.setattr(base_iter, "_warned_fast_forward", set())
    with pytest.warns(UserWarning, match=_FAST_FORWARD):
        assert_resumes_exactly(
            lambda: build(num_workers, dataset=AugmentedStream(), batch_size=3),
            steps=None if num_workers == 0 else 5,
        )


def test_iterable_fast_forward_warns_once_per_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base_iter, "_warned_fast_forward", set())
    dataset = AugmentedStream()
    loader = build(dataset=dataset, batch_size=3)
    next(iter(loader))
    state = loader.state_dict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            again = build(dataset=dataset, batch_size=3)
            again.load_state_dict(state)
            list(again)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert messages == [
        "Resuming AugmentedStream (an IterableDataset) by reading its first 1 batches again "
        "and dropping them: an iterable cannot seek."
    ]


# -- shard=True (one process standing in for rank 1 of 3) -------------------------------------

@pytest.mark.parametrize(
    ("num_workers", "shard_even"), [(0, "pad"), (0, "exact"), (0, "drop"), (2, "exact")]
)
def test_sharded(num_workers: int, shard_even: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 samples, rank 1 of 3, batch_size=3: 7 samples (pad, exact) or 6 (drop) per epoch.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    check = assert_resumes_exactly(
        loaders(num_workers=num_workers, n=20, shuffle=True, batch_size=3, shard=True,
                shard_even=shard_even),
        epochs=3, steps=None if num_workers == 0 else 5,
    )
    per_epoch = 2 if shard_even == "drop" else 3
    assert check.epoch_lengths == (per_epoch,) * 3


def test_sharded_iterable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr(base_iter, "_warned_fast_forward", set())
    with pytest.warns(UserWarning, match=_FAST_FORWARD):
        check = assert_resumes_exactly(
            lambda: build(dataset=AugmentedStream(20), batch_size=2, shard=True)
        )
    assert check.epoch_lengths == (4, 4)  # rank 1 of 3 reads 1, 4, ..., 19: 7 samples


# -- the cost of a state and of a resume (numbers, not asserts) ------------------------------

def test_report_resume_cost(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints what ``benchmarks/resume_cost.py`` measures, at a small size (run with ``-s``)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "resume_cost.py"
    spec = importlib.util.spec_from_file_location("_resume_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    record = module.measure(num_samples=100_000, state_calls=2_000, repeats=1)
    with capsys.disabled():
        print(f"\nresume cost (100k samples): {record}")
    assert record["resumed_first_index_ok"]


# -- the helper itself: it catches broken resumes -------------------------------------------

class FakeLoader:
    """The protocol the helper drives (2 epochs of 4 batches), with an optional bug."""

    def __init__(self, bug: str | None = None) -> None:
        self.bug = bug
        self.epoch, self.pos, self.done = 0, 0, False
        self.iterated = False
        self.loaded: dict[str, Any] | None = None
        self.live = {"epoch": 0, "pos": 0}

    def __iter__(self) -> Any:
        if self.loaded is not None:
            self.epoch, self.pos = self.loaded["epoch"], self.loaded["pos"]
            self.pos += self.bug == "skips_one" and self.pos > 0  # mid-epoch resumes only
            self.loaded = None
        elif self.iterated:
            self.epoch, self.pos = self.epoch + 1, 0
        self.iterated, self.done = True, False
        while self.pos < 4:
            self.pos += 1
            self.live["pos"] = self.pos
            yield {"index": torch.tensor([10 * self.epoch + self.pos - 1])}
        self.done = True

    def state_dict(self) -> dict[str, Any]:
        if self.loaded is not None:
            return {} if self.bug == "forgets_loaded" else dict(self.loaded)
        if self.bug == "side_effect" and self.iterated:
            self.pos += 1
        state = {"epoch": self.epoch + 1, "pos": 0} if self.done else {
            "epoch": self.epoch, "pos": self.pos}
        if self.bug == "live":
            self.live.update(state)
            return self.live
        if self.bug == "not_json":
            state["rng"] = torch.zeros(2)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)


def test_helper_passes_a_correct_loader() -> None:
    check = assert_resumes_exactly(FakeLoader)
    assert check == ResumeCheck(epoch_lengths=(4, 4), steps=tuple(range(9)), resumes=10)


HELPER_FAILURES = [
    ("skips_one",
     "resumed from the state saved after step k=1 (epoch 0, 1 of its 4 batches received, before "
     "StopIteration): epoch 0 (its first 1 batches were received before the save, the rest "
     "after load_state_dict): batch 1 (of 4): batch['index']: tensors of shape (1,) first "
     "differ at index (0,): expected 1, got 2 (1 element(s) differ)"),
    ("side_effect",
     "the run that called state_dict() at each save point differs from the uninterrupted run "
     "(state_dict() must not change what the loader yields): epoch 0: batch 1 (of 4): "
     "batch['index']: tensors of shape (1,) first differ at index (0,): expected 1, got 2 "
     "(1 element(s) differ)"),
    ("live",
     "state_dict() after step k=0 returned an object that changed after it was returned: it "
     "must be a snapshot, not a live view of the loader"),
    ("not_json",
     "state_dict() after step k=0 is not JSON-serializable (Object of type Tensor is not JSON "
     "serializable); offending value at state['rng'] (a Tensor)"),
    ("forgets_loaded",
     "resumed from the state of a loader never iterated (step 0): state_dict() right after "
     "load_state_dict() (before iterating) is not the loaded state; a job preempted again "
     "before its first batch would save a different position"),
]


@pytest.mark.parametrize(("bug", "message"), HELPER_FAILURES)
def test_helper_names_what_broke(bug: str, message: str) -> None:
    with pytest.raises(AssertionError) as failure:
        assert_resumes_exactly(lambda: FakeLoader(bug))
    assert str(failure.value) == message


def test_helper_names_the_step_and_the_batch_before_and_after_the_save() -> None:
    with pytest.raises(AssertionError) as failure:
        assert_resumes_exactly(lambda: FakeLoader("skips_one"), steps=[5])
    assert str(failure.value) == (
        "resumed from the state saved after step k=5 (epoch 1, 1 of its 4 batches received, "
        "before StopIteration): epoch 1 (its first 1 batches were received before the save, the "
        "rest after load_state_dict): batch 1 (of 4): batch['index']: tensors of shape (1,) "
        "first differ at index (0,): expected 11, got 12 (1 element(s) differ)"
    )


def test_batch_comparisons_name_the_leaf() -> None:
    nan = float("nan")
    same_batches([{"x": np.array([1.0, nan]), "y": [1, "a"]}],
                 [{"x": np.array([1.0, nan]), "y": [1, "a"]}])
    cases = [
        ([{"x": np.array([1, 2])}], [{"x": np.array([1, 3])}],
         "batch 0 (of 1): batch['x']: arrays of shape (2,) first differ at index (1,): "
         "expected np.int64(2), got np.int64(3) (1 element(s) differ)"),
        ([torch.zeros(2)], [torch.zeros(2, dtype=torch.float64)],
         "batch 0 (of 1): batch: expected a tensor of dtype torch.float32 and shape (2,), got "
         "dtype torch.float64 and shape (2,)"),
        ([(1, [2, "a"])], [(1, [2, "b"])], "batch 0 (of 1): batch[1][1]: expected 'a', got 'b'"),
        ([[1]], [[1], [2]], "expected 1 batches, got 2; the first extra batch is [2]"),
    ]
    for expected, got, message in cases:
        with pytest.raises(AssertionError) as failure:
            same_batches(expected, got)
        assert str(failure.value) == message
    same_batches_any_order([torch.tensor([1]), torch.tensor([2])],
                           [torch.tensor([2]), torch.tensor([1])])
    with pytest.raises(AssertionError, match=r"^\(batches sorted by content\) batch "):
        same_batches_any_order([torch.tensor([1]), torch.tensor([1])],
                               [torch.tensor([1]), torch.tensor([2])])
