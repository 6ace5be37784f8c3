"""``assert_resumes_exactly`` over the loader's configuration matrix.

Every dataset here draws from ``random``, numpy's global RNG and torch's global RNG in
``__getitem__``/``__iter__``, so the batches also check the augmentations after a resume.

Seeding (the ``seeding`` fixture, ``conftest.py``)
    The matrix runs under explicit per-batch seeding (``seeding="per_batch"`` in ``build``),
    which makes augmentations depend only on (base seed, epoch, batch position): the same after
    a resume and the same for any ``num_workers``, whatever the caller's global RNGs did. Every
    configuration that resumes with the ``num_workers`` it saved with runs under the default
    seeding too (torch's per-worker seeding, NOTE [ Same as torch unless asked ]; the fixture
    clears ``STOKER_BEYOND_TORCH`` so the default is torch's): each worker draws from its own
    streams, which the state carries (NOTE [ Worker streams resume ]), and with
    ``num_workers=0`` the samples draw from the main process's global RNGs, which the state
    carries too (NOTE [ Main streams resume ]); the resume is as exact. ``build`` then seeds
    ``random``, numpy and torch first, as a script does at its start, so that the reference,
    the saving run and every resumed run start from the same streams. Two promises hold only
    under per-batch seeding, so their tests name it alone: resuming at another
    ``num_workers`` (under torch's seeding the rest of the epoch depends on which worker loads
    which batch; such a state is refused, tested here too), and ``in_order=False`` below
    (under torch's seeding which worker loads a batch depends on timing, so its augmentations
    differ run to run even without a resume; ``test_worker_stream_resume`` checks what holds
    there: every worker's stream continues).

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
from stoker._core import beyond_torch
from stoker.distributed import shard_iterable
from stoker.engine import cursor
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


PER_BATCH, DEFAULT = "per_batch", "default"  # the ``seeding`` fixture's values (conftest)


def seed_globals(seed: int = 1234) -> None:
    """What a script does at its start (``seed_everything``)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build(
    num_workers: int = 0, *, dataset: Any = None, n: int = N, seed: int | None = 3,
    loader_cls: type = stoker.DataLoader, seeding: str = PER_BATCH, **kwargs: Any,
) -> Any:
    """A loader over a fresh dataset; ``seed=None`` means ``generator=None`` (global RNG).

    ``seeding``: ``"default"`` passes none (torch's seeding) and seeds the global RNGs first
    (module docstring); any other value is passed as ``seeding=``."""
    if seeding != PER_BATCH:
        seed_globals()  # torch's seeding with num_workers=0: the samples draw from these
    if seeding != DEFAULT:
        kwargs["seeding"] = seeding
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
def test_map_style_every_step(
    shuffle: bool, drop_last: bool, batch_size: int | None, seeding: str
) -> None:
    check = assert_resumes_exactly(
        loaders(shuffle=shuffle, drop_last=drop_last, batch_size=batch_size, seeding=seeding),
        epochs=2,
    )
    per_epoch = N if batch_size in (None, 1) else (N // 5 if drop_last else -(-N // 5))
    assert check.epoch_lengths == (per_epoch, per_epoch)
    assert check.steps == tuple(range(2 * per_epoch + 1))


def test_three_epochs_odd_size(seeding: str) -> None:
    assert_resumes_exactly(loaders(n=23, shuffle=True, batch_size=4, seeding=seeding), epochs=3)


def test_per_worker_seeding_resumes_with_workers_off() -> None:
    # seeding="per_worker" named (the default's value) with num_workers=0: the samples draw
    # from the caller's global RNGs, whose states at the epoch start and at the save point
    # travel in the state (NOTE [ Main streams resume ]): augmentations resume too.
    loader = build(shuffle=True, batch_size=3, seeding="per_worker")
    assert set(loader.state_dict()["rng"]) == {"generator", "globals", "globals_at_save"}
    assert_resumes_exactly(loaders(shuffle=True, batch_size=3, seeding="per_worker"), epochs=3)


# -- map-style with workers ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("shuffle", "batch_size", "drop_last"),
    [(True, 5, False), (False, None, False), (True, 4, True)],
)
def test_map_style_two_workers(
    shuffle: bool, batch_size: int | None, drop_last: bool, seeding: str
) -> None:
    assert_resumes_exactly(
        loaders(num_workers=2, shuffle=shuffle, batch_size=batch_size, drop_last=drop_last,
                seeding=seeding),
        steps=5,
    )


@pytest.mark.parametrize("batch_size", [None, 4])
def test_sharded_with_two_workers(batch_size: int | None, seeding: str) -> None:
    # shard=True's sampler takes a loaded position at iter(), and worker iterators call iter()
    # twice: with batch_size=None (no BatchSampler between) the second call started the
    # epoch from its beginning again (found by a combination smoke of the options)
    assert_resumes_exactly(
        loaders(num_workers=2, shuffle=True, batch_size=batch_size, shard=True, seeding=seeding),
        steps=5,
    )


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0), (2, 1)])
def test_resume_with_different_num_workers(before: int, after: int) -> None:
    # Per-batch seeding only: its augmentations do not depend on num_workers.
    assert_resumes_exactly(
        loaders(num_workers=before, shuffle=True, batch_size=3),
        resume_loader=loaders(num_workers=after, shuffle=True, batch_size=3),
        steps=4,
    )


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_default_seeding_refuses_another_num_workers(
    before: int, after: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under torch's seeding the rest of the epoch continues streams only num_workers=before
    # has: the state is refused, naming the seeding that resumes anywhere.
    monkeypatch.delenv(beyond_torch.ENV, raising=False)
    loader = build(before, shuffle=True, batch_size=3, seeding=DEFAULT)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError) as info:
        build(after, shuffle=True, batch_size=3, seeding=DEFAULT).load_state_dict(state)
    if before == 0:
        cause = ("its samples drew their random numbers from the main process's global RNGs "
                 "(num_workers=0), so the rest of the epoch continues those streams")
    else:
        cause = ("each worker draws its random numbers from its own streams, seeded once with "
                 "base_seed + worker_id, so the rest of the epoch depends on which worker loads "
                 "which batch")
    assert str(info.value) == (
        f"load_state_dict: this state was saved with num_workers={before} under torch's "
        f"per-worker seeding (seeding=\"per_worker\"): {cause} and cannot be drawn by "
        f"num_workers={after}. Load it into a loader with num_workers={before}, or save it from "
        "a loader built with seeding=\"per_batch\" (or beyond_torch=True), which seeds every "
        "batch from its position: its states resume at any num_workers."
    )


@pytest.mark.parametrize("key", ["globals", "globals_at_save"])
def test_a_corrupted_main_rng_state_is_refused(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(beyond_torch.ENV, raising=False)
    loader = build(shuffle=True, batch_size=3, seeding=DEFAULT)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    state["rng"][key] = "aGVsbG8="  # base64, but not of RNG states
    with pytest.raises(ValueError) as info:
        build(shuffle=True, batch_size=3, seeding=DEFAULT).load_state_dict(state)
    assert str(info.value) == (
        f"load_state_dict: state['rng'][{key!r}] is not the main process's global RNG states "
        "(not one stoker.DataLoader.state_dict() wrote). Pass the dict returned by "
        "DataLoader.state_dict() unchanged."
    )


def test_out_of_order_delivery() -> None:
    # Per-batch seeding only: under torch's seeding the worker that loads a batch (and so its
    # augmentations) depends on timing with in_order=False (module docstring).
    assert_resumes_exactly(
        loaders(num_workers=2, dataset=SlowOnWorker0(), shuffle=True, batch_size=2,
                in_order=False),
        steps=None, compare=same_batches_any_order,  # every step: some states hold extras
    )


def test_persistent_workers(seeding: str) -> None:
    assert_resumes_exactly(
        loaders(num_workers=2, shuffle=True, batch_size=3, persistent_workers=True,
                seeding=seeding),
        epochs=3, steps=5,
    )


# -- generator=None: torch's global RNG ------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_global_rng(num_workers: int, seeding: str) -> None:
    assert_resumes_exactly(
        loaders(num_workers=num_workers, seed=None, shuffle=True, batch_size=5, seeding=seeding),
        epochs=3, steps=None if num_workers == 0 else 5,
    )


def test_global_rng_with_a_full_checkpoint(seeding: str) -> None:
    # The training checkpoint restores torch's global RNG too, before load_state_dict: the
    # loader's own restore must agree with it.
    assert_resumes_exactly(
        loaders(seed=None, shuffle=True, batch_size=5, loader_cls=GlobalRngCheckpoint,
                seeding=seeding),
        epochs=3,
    )


def _callers_draws(seeding: str, num_workers: int = 0) -> list[Any]:
    """The caller's next draws: torch's global RNG (the order's source: the loader restores
    it); under torch's seeding with num_workers=0 ``random``'s and numpy's too (the samples
    drew from all three: the loader restores them)."""
    if seeding == PER_BATCH or num_workers:
        return [torch.rand(3)]
    return [torch.rand(3), random.random(), np.random.rand()]


def test_global_rng_resumed_run_continues_the_callers_stream(seeding: str) -> None:
    # After a resume, the global RNGs are where the uninterrupted run had them at the save
    # point, whatever the resumed process did to them before load_state_dict. Per-batch
    # seeding leaves them to the caller while a batch loads; under torch's seeding the next
    # batch draws from them first, as it did in the uninterrupted run.
    reference = build(seed=None, shuffle=True, batch_size=5, seeding=seeding)
    it = iter(reference)
    next(it)
    state = reference.state_dict()
    following = [next(it)] if seeding == DEFAULT else []
    expected = _callers_draws(seeding)  # the caller's next draws in the uninterrupted run
    resumed = build(seed=None, shuffle=True, batch_size=5, seeding=seeding)
    seed_globals(99)  # the resumed process drew something else meanwhile
    resumed.load_state_dict(state)
    batch = next(iter(resumed))
    if following:
        same_batches(following, [batch])
    got = _callers_draws(seeding)
    assert torch.equal(got[0], expected[0])
    assert got[1:] == expected[1:]


def _resume_between_iter_and_the_first_batch(before: int, after: int, seeding: str) -> None:
    """torchdata's test_map_iterrupted_shuffle: a state taken right after iter(). Without a
    generator a RandomSampler draws its seed from torch's global RNG at its first next(),
    which with num_workers=0 comes after that state (workers send tasks at iter(): before it):
    the resumed run must draw it on the same side of the save point (NOTE [ Main streams
    resume ]), whatever its own num_workers."""
    reference = build(before, seed=None, shuffle=True, batch_size=5, seeding=seeding)
    it = iter(reference)
    state = reference.state_dict()
    expected = list(it)
    expected_draws = _callers_draws(seeding, before)
    resumed = build(after, seed=None, shuffle=True, batch_size=5, seeding=seeding)
    seed_globals(99)
    resumed.load_state_dict(state)
    same_batches(expected, list(resumed))
    got = _callers_draws(seeding, before)
    assert torch.equal(got[0], expected_draws[0])
    assert got[1:] == expected_draws[1:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_between_iter_and_the_first_batch(num_workers: int, seeding: str) -> None:
    _resume_between_iter_and_the_first_batch(num_workers, num_workers, seeding)


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
def test_state_between_iter_and_the_first_batch_at_another_num_workers(
    before: int, after: int
) -> None:
    _resume_between_iter_and_the_first_batch(before, after, PER_BATCH)


@pytest.mark.parametrize("iterable", [False, True], ids=["map", "iterable"])
def test_preempted_again_before_the_first_batch(
    iterable: bool, seeding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A resumed job saves again between iter() and its first batch: that state must resume
    # exactly too. An iterable at num_workers=0 under torch's seeding is read up to the save
    # point from the epoch start's global RNGs; the state taken meanwhile keeps the loaded
    # save point.
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())

    def make() -> Any:
        dataset = AugmentedStream() if iterable else None
        return build(dataset=dataset, shuffle=not iterable, batch_size=3, seeding=seeding)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the iterable's fast-forward
        expected = list(make())
        first = make()
        it = iter(first)
        head = [next(it), next(it)]
        state = first.state_dict()
        second = make()
        second.load_state_dict(state)
        again = iter(second)
        state = second.state_dict()
        del again
        third = make()
        third.load_state_dict(state)
        same_batches(expected, head + list(third))


# -- samplers --------------------------------------------------------------------------------

def test_subset_random_sampler(seeding: str) -> None:
    def make() -> Any:
        sampler = SubsetRandomSampler(range(1, N, 2), generator=torch.Generator().manual_seed(5))
        return build(sampler=sampler, batch_size=2, seeding=seeding)

    assert_resumes_exactly(make)


def test_weighted_random_sampler(seeding: str) -> None:
    def make() -> Any:
        sampler = WeightedRandomSampler(
            [float(i + 1) for i in range(N)], num_samples=17, replacement=True,
            generator=torch.Generator().manual_seed(6),
        )
        return build(sampler=sampler, batch_size=3, seeding=seeding)

    assert_resumes_exactly(make)


def test_custom_batch_sampler(seeding: str) -> None:
    check = assert_resumes_exactly(
        lambda: build(batch_sampler=RandomSizeBatches(N), seeding=seeding), epochs=3
    )
    assert len(set(check.epoch_lengths)) > 1, "the batch sizes should differ between epochs"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_with_its_own_state(num_workers: int, seeding: str) -> None:
    # Its epoch is advanced by the loader's epoch autopilot (it has set_epoch and ``epoch``),
    # so a state saved after an epoch's loop ended must carry the *next* epoch.
    assert_resumes_exactly(
        lambda: build(num_workers, sampler=ResumableSampler(N), batch_size=3, seeding=seeding),
        epochs=3, steps=None if num_workers == 0 else 5,
    )


# -- IterableDataset -------------------------------------------------------------------------

_FAST_FORWARD = re.escape("Resuming AugmentedStream (an IterableDataset) by reading its first ")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset(
    num_workers: int, seeding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warning is given once per dataset object, remembered by id(); a fresh registry keeps
    # an id reused from an earlier test's dataset from hiding it.
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())
    with pytest.warns(UserWarning, match=_FAST_FORWARD):
        assert_resumes_exactly(
            lambda: build(num_workers, dataset=AugmentedStream(), batch_size=3, seeding=seeding),
            steps=None if num_workers == 0 else 5,
        )


def test_iterable_fast_forward_warns_once_per_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())
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
def test_sharded(
    num_workers: int, shard_even: str, seeding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 samples, rank 1 of 3, batch_size=3: 7 samples (pad, exact) or 6 (drop) per epoch.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    check = assert_resumes_exactly(
        loaders(num_workers=num_workers, n=20, shuffle=True, batch_size=3, shard=True,
                shard_even=shard_even, seeding=seeding),
        epochs=3, steps=None if num_workers == 0 else 5,
    )
    per_epoch = 2 if shard_even == "drop" else 3
    assert check.epoch_lengths == (per_epoch,) * 3


def test_sharded_iterable(seeding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr(cursor, "_warned_fast_forward", set())
    with pytest.warns(UserWarning, match=_FAST_FORWARD):
        check = assert_resumes_exactly(
            lambda: build(dataset=AugmentedStream(20), batch_size=2, shard=True, seeding=seeding)
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
