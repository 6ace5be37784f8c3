"""Contract helpers to run on your own pipeline: does it resume exactly?

``assert_resumes_exactly(make_loader)`` checks the promise of ``state_dict()`` /
``load_state_dict()``: stopping after any batch, saving the state, restoring it into a *new*
loader (a new process, in real life) and carrying on gives exactly the batches an
uninterrupted run gives, augmentations included. Run it in a test::

    from stoker.testing import assert_resumes_exactly

    def make_loader():
        return stoker.DataLoader(MyDataset(...), batch_size=8, shuffle=True,
                                 generator=torch.Generator().manual_seed(0))

    def test_my_pipeline_resumes():
        assert_resumes_exactly(make_loader, epochs=2, steps=10)

What it does (after grain's ``assert_equal_output_after_checkpoint``):

1. *Reference*: ``make_loader()``, iterated ``epochs`` times (``for epoch ...: for b in
   loader``), without ever calling ``state_dict()``.
2. *Saving run*: a second ``make_loader()`` iterated the same way, like a training loop that
   checkpoints and keeps going. At each chosen save point it calls ``state_dict()`` and
   serializes it at once through ``json.dumps``/``json.loads`` and ``torch.save``/``torch.load``
   (``weights_only=True``, into a ``BytesIO``), as a checkpoint would. Its output must equal the
   reference (``state_dict()`` has no side effects), and at the end every raw state must still
   serialize to what it did when returned (a state is a snapshot, not a live view).
3. For each save point: ``resume_loader()`` (default ``make_loader``; pass another factory to
   resume with, e.g., a different ``num_workers``), ``load_state_dict(state)``, check that
   ``state_dict()`` before iterating gives the loaded state back, then run the rest: the rest of
   the epoch the save was in, then the remaining epochs. What the saving run had received
   before the save, followed by that, must equal the reference, epoch by epoch.

Save points: the state of a loader never iterated (step 0, always checked); after the
``k``-th batch, for each chosen ``k`` (mid-epoch, before the loop sees ``StopIteration``: the
resumed run then re-enters that epoch, which may have nothing left); and, where ``k`` ends an
epoch, also after the ``for`` loop ended (the resumed run starts at the next epoch).

Cost: with ``T`` batches in ``epochs`` epochs, checking every step reads about
``2T + T**2 / 2`` batches and builds about ``T + epochs + 2`` loaders (each starting its
workers, once per epoch unless they are persistent). That is quadratic: for anything but a toy
dataset pass ``steps``: an int picks about that many save points spread over the run (always
step 0, the end of the first epoch and the last batch); a collection of ints picks those ``k``
(and step 0).

``compare(expected, got)`` compares one epoch's batches (two lists) and raises
``AssertionError``; the default, ``same_batches``, wants the same batches in the same order,
equal leaf by leaf (tensors and arrays: same dtype, shape and values, NaN equal to NaN). With
``in_order=False`` the order in which batches arrive is not reproducible, run to run, even
without a resume; pass ``same_batches_any_order``: each epoch must then hold the same batches
(as whole batches, contents and augmentations included), each exactly once, in any order.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

from stoker.testing.batches import (
    content_key,
    first_difference,
    non_plain_path,
    same_batches,
    same_batches_any_order,
)

__all__ = [
    "ResumeCheck",
    "assert_resumes_exactly",
    "content_key",
    "first_difference",
    "same_batches",
    "same_batches_any_order",
]

Compare = Callable[[Sequence[Any], Sequence[Any]], None]
SaveKind = Literal["fresh", "mid", "end"]


class _Resumable(Protocol):
    """What the helper uses of a loader (stoker's, torchdata's, any): iterating and saving."""

    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class ResumeCheck:
    """What ``assert_resumes_exactly`` checked: batches per epoch and the steps resumed from."""

    epoch_lengths: tuple[int, ...]
    steps: tuple[int, ...]
    resumes: int


@dataclass
class _Save:
    k: int
    epoch: int
    index: int  # batches of ``epoch`` received before the save
    kind: SaveKind
    raw: Any
    text: str
    state: Any

    def describe(self, lengths: Sequence[int]) -> str:
        if self.kind == "fresh":
            return "resumed from the state of a loader never iterated (step 0)"
        where = "after its for-loop ended" if self.kind == "end" else "before StopIteration"
        return (
            f"resumed from the state saved after step k={self.k} (epoch {self.epoch}, "
            f"{self.index} of its {lengths[self.epoch]} batches received, {where})"
        )


# -- the helper -----------------------------------------------------------------------------


def assert_resumes_exactly(
    make_loader: Callable[[], Any],
    *,
    epochs: int = 2,
    steps: int | Collection[int] | None = None,
    resume_loader: Callable[[], Any] | None = None,
    compare: Compare | None = None,
) -> ResumeCheck:
    """Assert that resuming after any step gives the uninterrupted output (module docstring).

    Returns what was checked; raises ``AssertionError`` naming the step resumed from, the epoch,
    the batch index and the first differing leaf.
    """
    __tracebackhide__ = True  # pytest: show the caller, not this frame
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r}: expected an int >= 1")
    compare = same_batches if compare is None else compare
    resume_loader = make_loader if resume_loader is None else resume_loader
    reference = _run_epochs(make_loader(), range(epochs))
    lengths = [len(batches) for batches in reference]
    ks = _resolve_steps(steps, lengths)
    saved_run, saves = _saving_run(make_loader, epochs, ks)
    _compare_epochs(compare, reference, saved_run, "the run that called state_dict() at each "
                    "save point differs from the uninterrupted run (state_dict() must not "
                    "change what the loader yields)")
    for save in saves:
        if json.dumps(save.raw, sort_keys=True) != save.text:
            raise AssertionError(
                f"state_dict() after step k={save.k} returned an object that changed after it "
                "was returned: it must be a snapshot, not a live view of the loader"
            )
    for save in saves:
        got = _resume(resume_loader, save, saved_run, epochs, lengths)
        _compare_epochs(compare, reference, got, save.describe(lengths), save)
    return ResumeCheck(tuple(lengths), tuple(sorted({s.k for s in saves})), len(saves))


def _run_epochs(loader: _Resumable, epochs: range) -> list[list[Any]]:
    return [[_detach(batch) for batch in loader] for _ in epochs]


def _saving_run(
    make_loader: Callable[[], _Resumable], epochs: int, ks: set[int]
) -> tuple[list[list[Any]], list[_Save]]:
    __tracebackhide__ = True
    loader = make_loader()
    saves: list[_Save] = []
    if 0 in ks:
        saves.append(_capture(loader, 0, 0, 0, "fresh"))
    out: list[list[Any]] = []
    k = 0
    for epoch in range(epochs):
        batches: list[Any] = []
        for batch in loader:
            batches.append(_detach(batch))
            k += 1
            if k in ks:
                saves.append(_capture(loader, k, epoch, len(batches), "mid"))
        out.append(batches)
        if batches and k in ks and epoch < epochs - 1:
            saves.append(_capture(loader, k, epoch, len(batches), "end"))
    return out, saves


def _capture(loader: _Resumable, k: int, epoch: int, index: int, kind: SaveKind) -> _Save:
    __tracebackhide__ = True
    raw = loader.state_dict()
    try:
        text = json.dumps(raw, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise AssertionError(
            f"state_dict() after step k={k} is not JSON-serializable ({exc}); "
            f"offending value at {non_plain_path(raw, 'state')}"
        ) from None
    state = _torch_round_trip(json.loads(text), k)
    _torch_round_trip(raw, k)  # the raw state must load with weights_only=True too
    return _Save(k, epoch, index, kind, raw, text, state)


def _torch_round_trip(state: Any, k: int) -> Any:
    __tracebackhide__ = True
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True)
    except Exception as exc:
        raise AssertionError(
            f"state_dict() after step k={k} does not load back with "
            f"torch.load(weights_only=True): {type(exc).__name__}: {exc}"
        ) from None


def _resume(
    resume_loader: Callable[[], _Resumable], save: _Save, saved_run: list[list[Any]],
    epochs: int, lengths: Sequence[int],
) -> list[list[Any]]:
    __tracebackhide__ = True
    loader = resume_loader()
    loader.load_state_dict(save.state)
    again = json.loads(json.dumps(loader.state_dict(), sort_keys=True))
    if again != json.loads(save.text):
        raise AssertionError(
            f"{save.describe(lengths)}: state_dict() right after load_state_dict() (before "
            "iterating) is not the loaded state; a job preempted again before its first batch "
            "would save a different position"
        )
    if save.kind == "fresh":
        return _run_epochs(loader, range(epochs))
    first = save.epoch if save.kind == "mid" else save.epoch + 1
    rest = _run_epochs(loader, range(first, epochs))
    got = [list(batches) for batches in saved_run[:first]]
    if save.kind == "mid":
        got.append(saved_run[save.epoch][: save.index] + rest.pop(0))
    return got + rest


def _compare_epochs(
    compare: Compare, expected: list[list[Any]], got: list[list[Any]], context: str,
    save: _Save | None = None,
) -> None:
    __tracebackhide__ = True
    if len(expected) != len(got):
        raise AssertionError(f"{context}: expected {len(expected)} epochs, got {len(got)}")
    for epoch, (exp, act) in enumerate(zip(expected, got, strict=True)):
        try:
            compare(exp, act)
        except AssertionError as exc:
            origin = ""
            if save is not None and save.kind == "mid" and epoch == save.epoch:
                origin = (f" (its first {save.index} batches were received before the save, the "
                          "rest after load_state_dict)")
            elif save is not None and save.kind != "fresh" and epoch <= save.epoch:
                origin = " (received before the save)"
            elif save is not None:
                origin = " (received after load_state_dict)"
            raise AssertionError(f"{context}: epoch {epoch}{origin}: {exc}") from None


def _resolve_steps(steps: int | Collection[int] | None, lengths: Sequence[int]) -> set[int]:
    total = sum(lengths)
    if steps is None:
        return set(range(total + 1))
    if isinstance(steps, bool):
        raise TypeError("steps must be None, an int (how many save points) or a collection of ints")
    if isinstance(steps, int):
        if steps < 1:
            raise ValueError(f"steps={steps}: expected at least 1 save point")
        picked = {round(x) for x in np.linspace(0, total, num=steps)} if steps > 1 else {0}
        if steps >= 3:
            picked |= {lengths[0], total}
        return picked | {0}
    chosen = set(steps) | {0}
    bad = sorted(k for k in chosen if not (isinstance(k, int) and 0 <= k <= total))
    if bad:
        raise ValueError(
            f"steps {bad} are out of range: the uninterrupted run has {total} batches in "
            f"{len(lengths)} epoch(s) ({list(lengths)}), so k must be in [0, {total}]"
        )
    return chosen


# -- keeping batches -------------------------------------------------------------------------


def _detach(batch: Any) -> Any:
    """A copy that owns its memory, so the loader can recycle its shared-memory slabs."""
    if isinstance(batch, torch.Tensor):
        return batch.detach().clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, Mapping):
        items = {key: _detach(value) for key, value in batch.items()}
        try:
            return type(batch)(items)  # type: ignore[call-arg]
        except Exception:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_detach(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_detach(v) for v in batch)
    return batch
