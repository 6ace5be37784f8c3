"""Whether a saved state fits the loader it is loaded into (NOTE [ Resume state ]).

NOTE [ A state must fit its loader ]
A state records positions: "batch 7 of the epoch drawn from these generator states". Those
positions mean the same samples only for the same dataset length, batch size, ``drop_last``
and kind of sampler: loaded into a loader whose dataset grew from 100 to 120 samples, or whose
``batch_size`` or ``shuffle`` changed, the same positions name other samples, and the epoch
would silently repeat some and never show others. So ``state_dict()`` records what the
positions depend on (``"loader"``), and ``load_state_dict`` refuses a state that does not fit,
naming the field, the saved value and the current one. The world size may differ; so may
``num_workers`` and ``worker_type`` under per-batch seeding (each batch's draws depend on its
position alone), but under torch's per-worker seeding the rest of the epoch continues the
streams of the workers (or, with ``num_workers=0``, of the main process) that drew the
delivered batches, so a state that delivered anything is refused at another ``num_workers``
(``check_worker_streams``, NOTE [ Worker streams resume ]). Every field is type-checked and the
counts are checked against ``len(loader)``, so a hand-edited or corrupted state fails with the
field's name instead of an internal error, or a wrong resume.

A state also belongs to its rank: the base seed and generator states in it were drawn by the
process that saved it, and its workers' and dataset's progress are that rank's. So
``state_dict()`` records ``rank`` and ``world_size`` (``stoker.distributed.detect()``) and a
``digest`` of stoker's fields, and ``load_state_dict`` takes this rank's own part where the state
has every rank's, and otherwise refuses a mix of ranks' states: NOTE [ Every rank's part ] in
``engine.rank_state``. At another world size any one rank's state loads (elastic resume: a
``ShardedSampler``'s position is the same on every rank, and the old ranks have no
counterparts); so does a state with no rank recorded (saved by an older stoker, or where the
environment named no consistent rank). A state of one process is never mixed: its digest is not
checked, and an edited field gets its own error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# field -> (allowed types, what it should be)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "iterations": ((int,), "a count of epochs begun (int >= 0)"),
    "epoch": ((int,), "an epoch number (int >= 0)"),
    "batches": ((int,), "a count of batches delivered (int >= 0)"),
    "extra_batches": ((list,), "a list of batch positions (ints)"),
    "finished": ((bool,), "a bool"),
    "base_seed": ((int,), "an int seed"),
    "drew_base_seed": ((bool,), "a bool"),
    "sampler_state_applies": ((bool,), "a bool"),
    "rng": ((str, dict, type(None)), "the encoded generator states (str)"),
    "sampler_epoch": ((int, type(None)), "an int epoch or None"),
    "sampler_started": ((bool,), "a bool"),
    "dataset_kind": ((str,), "'map' or 'iterable'"),
    "num_workers": ((int,), "a worker count (int >= 0)"),
    "worker_batches": ((list, type(None)), "a list of batch counts per worker, or None"),
    "rank": ((int, type(None)), "the saving process's rank (int >= 0) or None"),
    "world_size": ((int, type(None)), "the saving process's world size (int >= 1) or None"),
    "digest": ((str, type(None)), "the digest state_dict() recorded (str)"),
    "ranks": ((list,), "every rank's part, as recorded when the state was saved (list)"),
}
_COUNTS = ("iterations", "epoch", "batches", "num_workers", "rank", "world_size")


def _class_name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def length_or_none(obj: Any) -> int | None:
    """``len(obj)``, or None where it has none."""
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None


def describe(
    dataset: Any, batch_size: int | None, drop_last: bool, sampler: Any, batch_sampler: Any
) -> dict[str, Any]:
    """What a state's positions depend on (plain values, JSON-safe)."""
    custom_batches = batch_sampler is not None and batch_size is None
    return {
        "dataset_len": length_or_none(dataset),
        "batch_size": batch_size,
        "drop_last": bool(drop_last),
        "sampler": _class_name(sampler),
        "shuffle": getattr(sampler, "shuffle", None),
        "batch_sampler": _class_name(batch_sampler) if custom_batches else None,
    }


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_fields(state: dict[str, Any]) -> None:
    """Each known field has its type; counts are not negative."""
    for name, (types, expected) in _FIELDS.items():
        if name not in state:
            continue
        value = state[name]
        wrong_type = not isinstance(value, types) or (
            bool not in types and isinstance(value, bool)
        )
        if wrong_type or (name in _COUNTS and value is not None and value < 0):
            raise ValueError(
                f"load_state_dict: state[{name!r}] is {value!r} ({_type_name(value)}), "
                f"expected {expected}. Pass the dict returned by DataLoader.state_dict() "
                "unchanged."
            )
    extras = state.get("extra_batches", [])
    if not all(type(p) is int and p >= 0 for p in extras):
        raise ValueError(
            f"load_state_dict: state['extra_batches'] is {extras!r}, expected a list of batch "
            "positions (ints >= 0). Pass the dict returned by DataLoader.state_dict() unchanged."
        )
    if state.get("dataset_kind", "map") not in ("map", "iterable"):
        raise ValueError(
            f"load_state_dict: state['dataset_kind'] is {state['dataset_kind']!r}, expected "
            "'map' or 'iterable'. Pass the dict returned by DataLoader.state_dict() unchanged."
        )


def _mismatch(field: str, saved: Any, now: Any) -> ValueError:
    return ValueError(
        f"load_state_dict: this state does not fit the loader: {field} was {saved!r} when it "
        f"was saved and is {now!r} now. Its batch positions would name other samples (some "
        "repeated, some never seen). Build the loader as it was when the state was saved, or "
        "start the epoch without loading the state."
    )


def check_fit(
    state: dict[str, Any], kind: str, described: Callable[[], dict[str, Any]],
    steps_now: Callable[[], int | None],
) -> None:
    """Refuse a state whose positions mean other samples in the loader it is loaded into
    (NOTE [ A state must fit its loader ]): ``kind`` is its dataset's, ``described()`` its
    ``describe``, ``steps_now()`` its ``len()`` (None: unknown); each read only when needed,
    in that order."""
    check_fields(state)
    if state.get("dataset_kind", kind) != kind:
        raise _mismatch("the dataset kind", state["dataset_kind"], kind)
    saved = state.get("loader")
    if saved is not None:
        if not isinstance(saved, dict):
            raise ValueError(
                f"load_state_dict: state['loader'] is {saved!r} ({_type_name(saved)}), "
                "expected the dict state_dict() records. Pass the dict returned by "
                "DataLoader.state_dict() unchanged."
            )
        now = described()
        for field, value in now.items():
            if field in saved and saved[field] != value:
                raise _mismatch(_LABELS[field], saved[field], value)
    steps = steps_now() if kind == "map" else None
    if steps is None:
        return
    batches = state.get("batches", 0)
    beyond = [p for p in state.get("extra_batches", []) if p >= steps]
    if batches > steps or beyond:
        field = "batches" if batches > steps else "extra_batches"
        what = f"batches={batches}" if batches > steps else f"batch positions {beyond}"
        raise ValueError(
            f"load_state_dict: state[{field!r}] says {what} were delivered, but an epoch of "
            f"this loader has {steps} batches "
            "(len(loader)). Pass the dict returned by DataLoader.state_dict() unchanged."
        )


_LABELS = {
    "dataset_len": "len(dataset)",
    "batch_size": "batch_size",
    "drop_last": "drop_last",
    "sampler": "the sampler (shuffle=True draws a RandomSampler, False a SequentialSampler)",
    "shuffle": "the sampler's shuffle",
    "batch_sampler": "the batch_sampler",
}
