"""torch.distributed integration: rank detection, equal step counts, the epoch autopilot.

Equal step counts and ``EndOfData``
    DDP runs a collective in every backward pass, so a rank that stops one step early leaves
    the others blocked at epoch end. With ``ShardedSampler(even="exact")`` (each sample once,
    for evaluation) a rank can be one batch short. The loader then keeps stepping: it yields
    ``EndOfData`` in place of the missing batch, so every rank takes
    ``sampler.num_batches(batch_size, drop_last)`` steps. ``even_batches()`` does exactly that
    to any stream of batches. The user's loop::

        for batch in loader:
            if isinstance(batch, stoker.EndOfData):   # or: if not batch  (it has len() == 0)
                preds = torch.empty(0, num_classes)    # still join the all_gather / all_reduce
            else:
                preds = model(batch["x"])
            gather_metrics(preds)

    A sentinel object, rather than an empty batch, because an empty batch has no shape to
    collate from, and a model fed one silently computes on nothing; the marker is impossible
    to mistake for data. With ``even="pad"`` or ``"drop"`` the ranks' shares are equal and no
    marker is ever yielded.

Epoch autopilot
    ``DistributedSampler`` reshuffles only when ``set_epoch`` is called, and forgetting it
    repeats one order every epoch. The loader calls ``begin_epoch(sampler, batch_sampler)`` at
    the start of each pass (in ``__iter__``, before the sampler is iterated). For every object
    in that chain with a ``set_epoch`` method, the rule is:

    * first pass seen for that object: leave its epoch as it is (0, or what the user set);
    * the user called ``set_epoch`` (or ``load_state_dict``) since the previous pass: leave
      it, the user runs the epochs;
    * otherwise: ``set_epoch(epoch + 1)``.

    "The user called it" is exact for stoker's ``ShardedSampler`` (it counts the calls). For
    other samplers it is read from their ``epoch`` attribute: a change since the previous pass
    means the user set it. The one case this cannot see is a user calling ``set_epoch`` with
    the same value every epoch to repeat the order on purpose. Samplers without a readable
    integer ``epoch`` are left alone. A loader applies the rule to other samplers than its own
    ``ShardedSampler`` only with ``beyond_torch`` naming ``epoch_autopilot``: torch repeats the
    order, and a default must not differ (NOTE [ Same as torch unless asked ]).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from stoker._core.lazy_exports import lazy_exports as _lazy_exports
from stoker.distributed.context import DistContext, detect, set_context
from stoker.sampling.sharded import ShardedSampler

# An iterable's shard helpers load when first read (NOTE [ Import only what the loader needs ]).
__getattr__, __dir__ = _lazy_exports(__name__, {
    name: "stoker.distributed.iterable"
    for name in ("ShardInfo", "shard_info", "shard_iterable", "shard_list")
})
if TYPE_CHECKING:
    from stoker.distributed.iterable import ShardInfo, shard_info, shard_iterable, shard_list

T = TypeVar("T")

__all__ = [
    "DistContext",
    "EndOfData",
    "EpochDecision",
    "ShardInfo",
    "ShardedSampler",
    "auto_set_epoch",
    "begin_epoch",
    "detect",
    "epoch_targets",
    "even_batches",
    "set_context",
    "shard_info",
    "shard_iterable",
    "shard_list",
]


@dataclass(frozen=True)
class EndOfData:
    """Yielded instead of a batch by a rank that has run out of data this epoch.

    ``step`` is the 0-based step it stands in for, ``num_batches`` the steps every rank takes
    this epoch. It is falsy and has ``len() == 0``: it holds no samples.
    """

    rank: int
    step: int
    num_batches: int

    def __len__(self) -> int:
        return 0


def even_batches(batches: Iterable[T], num_batches: int, *, rank: int) -> Iterator[T | EndOfData]:
    """Yield ``batches``, then ``EndOfData`` until ``num_batches`` steps have been taken.

    Raises if ``batches`` holds more than ``num_batches``: the ranks would disagree on the
    step count, which is the hang this exists to prevent.
    """
    step = 0
    for batch in batches:
        if step >= num_batches:
            raise RuntimeError(
                f"rank {rank} has more than num_batches={num_batches} batches this epoch; every "
                "rank must agree on num_batches (take it from sampler.num_batches())"
            )
        yield batch
        step += 1
    for pad_step in range(step, num_batches):
        yield EndOfData(rank=rank, step=pad_step, num_batches=num_batches)


# -- epoch autopilot ----------------------------------------------------------------------

EpochAction = Literal["first", "user", "auto"]


@dataclass(frozen=True)
class EpochDecision:
    """What ``begin_epoch`` did to one sampler: its epoch for this pass, and why."""

    target: object
    epoch: int
    action: EpochAction


# Foreign samplers: the epoch in effect at their last pass. Weak, so samplers die normally.
_last_epoch: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()


def epoch_targets(sampler: object, batch_sampler: object = None) -> list[object]:
    """The distinct objects among sampler, batch_sampler and its ``.sampler`` with ``set_epoch``."""
    chain = [sampler, batch_sampler, getattr(batch_sampler, "sampler", None)]
    chain.append(getattr(sampler, "sampler", None))  # a batch sampler passed as ``sampler``
    out: list[object] = []
    for obj in chain:
        if obj is not None and callable(getattr(obj, "set_epoch", None)):
            if all(obj is not seen for seen in out):
                out.append(obj)
    return out


def auto_set_epoch(sampler: object, epoch: int, batch_sampler: object = None) -> list[object]:
    """Call ``set_epoch(epoch)`` on every target in the chain; returns the objects it called."""
    targets = epoch_targets(sampler, batch_sampler)
    for obj in targets:
        obj.set_epoch(epoch)  # type: ignore[attr-defined]
    return targets


def begin_epoch(
    sampler: object, batch_sampler: object = None, autopilot: bool = True
) -> list[EpochDecision]:
    """The autopilot: apply the module docstring's rule to each target, once per pass.
    ``autopilot=False`` (a loader's default, NOTE [ Same as torch unless asked ]) leaves every
    sampler but stoker's own ``ShardedSampler`` (``shard=True``) alone, as torch does."""
    decisions = []
    for obj in epoch_targets(sampler, batch_sampler):
        if not autopilot and not isinstance(obj, ShardedSampler):
            continue
        decision = _decide(obj)
        if decision is not None:
            decisions.append(decision)
    return decisions


def next_epoch(
    sampler: object, batch_sampler: object = None, autopilot: bool = True
) -> int | None:
    """The epoch ``begin_epoch`` would give the sampler at its next pass (without setting it)."""
    for obj in epoch_targets(sampler, batch_sampler):
        epoch = getattr(obj, "epoch", None)
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            continue
        if not autopilot and not isinstance(obj, ShardedSampler):
            return epoch
        if isinstance(obj, ShardedSampler):
            auto = obj.passes_started > 0 and not obj.epoch_set_since_last_pass()
        else:
            try:
                auto = _last_epoch.get(obj) == epoch
            except TypeError:
                auto = False
        return epoch + 1 if auto else epoch
    return None


def _decide(obj: object) -> EpochDecision | None:
    if isinstance(obj, ShardedSampler):
        if obj.passes_started == 0:
            return EpochDecision(obj, obj.epoch, "first")
        if obj.epoch_set_since_last_pass():
            return EpochDecision(obj, obj.epoch, "user")
        obj.set_epoch(obj.epoch + 1)
        return EpochDecision(obj, obj.epoch, "auto")
    epoch = getattr(obj, "epoch", None)
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    try:
        last = _last_epoch.get(obj)
    except TypeError:  # unhashable or not weak-referenceable: cannot remember it, leave it be
        return None
    if last is None:
        action: EpochAction = "first"
    elif epoch != last:
        action = "user"
    else:
        epoch += 1
        obj.set_epoch(epoch)  # type: ignore[attr-defined]
        action = "auto"
    _last_epoch[obj] = epoch
    return EpochDecision(obj, epoch, action)
