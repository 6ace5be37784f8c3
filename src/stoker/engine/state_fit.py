"""Whether a saved state fits the loader it is loaded into (NOTE [ Resume state ]).

NOTE [ A state must fit its loader ]
A state records positions: "batch 7 of the epoch drawn from these generator states". Those
positions mean the same samples only for the same dataset length, batch size, ``drop_last``
and kind of sampler: loaded into a loader whose dataset grew from 100 to 120 samples, or whose
``batch_size`` or ``shuffle`` changed, the same positions name other samples, and the epoch
would silently repeat some and never show others. So ``state_dict()`` records what the
positions depend on (``"loader"``), and ``load_state_dict`` refuses a state that does not fit,
naming the field, the saved value and the current one; ``num_workers``, ``worker_type`` and the
world size may differ (the state is independent of them). Every field is type-checked and the
counts are checked against ``len(loader)``, so a hand-edited or corrupted state fails with the
field's name instead of an internal error, or a wrong resume.
"""

from __future__ import annotations

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
    "dataset_kind": ((str,), "'map' or 'iterable'"),
    "num_workers": ((int,), "a worker count (int >= 0)"),
    "worker_batches": ((list, type(None)), "a list of batch counts per worker, or None"),
}
_COUNTS = ("iterations", "epoch", "batches", "num_workers")


def _class_name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None


def describe(loader: Any) -> dict[str, Any]:
    """What a state's positions depend on (plain values, JSON-safe)."""
    custom_batches = loader.batch_sampler is not None and loader.batch_size is None
    return {
        "dataset_len": _length(loader.dataset),
        "batch_size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "sampler": _class_name(loader.sampler),
        "shuffle": getattr(loader.sampler, "shuffle", None),
        "batch_sampler": _class_name(loader.batch_sampler) if custom_batches else None,
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
        if wrong_type or (name in _COUNTS and value < 0):
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


def check_fit(state: dict[str, Any], loader: Any) -> None:
    """Refuse a state whose positions mean other samples in ``loader`` (NOTE [ A state must
    fit its loader ])."""
    check_fields(state)
    kind = "iterable" if loader._dataset_kind else "map"
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
        now = describe(loader)
        for field, value in now.items():
            if field in saved and saved[field] != value:
                raise _mismatch(_LABELS[field], saved[field], value)
    steps = _length(loader) if kind == "map" else None
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
