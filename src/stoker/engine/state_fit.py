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
process that saved it, and its workers' and dataset's progress are that rank's. Loaded on
another rank, the epoch would go on with that rank's seeds: the ranks' random augmentations
(and, with ``generator=None``, their global RNG streams) the same, with no error. That is what
``torch.distributed.checkpoint`` does to a loader every rank saves under one key: it keeps one
copy of each value, picking each value's copy on its own (to balance the writes), and loads it
everywhere, so a rank gets a mix: its own ``rank`` field, say, with another rank's
``base_seed``. So ``state_dict()`` records ``rank`` and ``world_size``
(``stoker.distributed.detect()``) and a ``digest`` of all the fields, and ``load_state_dict``
refuses, saying how to save per-rank state, a multi-rank state whose fields do not match its
digest (a mix) and a state saved by another rank of the same world size. At another world size
any one rank's state loads (elastic resume: a ``ShardedSampler``'s position is the same on
every rank, and the old ranks have no counterparts); so does a state with no rank recorded
(saved by an older stoker, or where the environment named no consistent rank). A state of one
process is never mixed: its digest is not checked, and an edited field gets its own error.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable
from typing import Any

from stoker.distributed.context import detect

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


def _place() -> tuple[int | None, int | None]:
    try:
        context = detect()
    except ValueError:  # a half-set RANK/WORLD_SIZE: no consistent rank to record
        return None, None
    return context.rank, context.world_size


def _crc(value: Any, crc: int) -> int:
    """CRC-32 of ``value``'s plain structure as it survives ``torch.save``, DCP and JSON: dict
    keys as strings in sorted order, tuples as lists; strings fed as bytes, not repr'd (the
    encoded RNG states are kilobytes)."""
    if isinstance(value, dict):
        crc = zlib.crc32(b"{", crc)
        for key, item in sorted(value.items(), key=lambda kv: str(kv[0])):
            crc = _crc(item, zlib.crc32(f"{str(key)!r}:".encode(), crc))
        return zlib.crc32(b"}", crc)
    if isinstance(value, (list, tuple)):
        crc = zlib.crc32(b"[", crc)
        for item in value:
            crc = zlib.crc32(b",", _crc(item, crc))
        return zlib.crc32(b"]", crc)
    if isinstance(value, str):
        crc = zlib.crc32(f"s{len(value)}:".encode(), crc)
        return zlib.crc32(value.encode("utf-8", "surrogatepass"), crc)
    return zlib.crc32(repr(value).encode(), crc)


def _digest(state: dict[str, Any]) -> str:
    """A digest of every field but ``digest`` itself: it matches only one rank's whole state
    (a check against mixing, not against tampering)."""
    return f"{_crc({k: v for k, v in state.items() if k != 'digest'}, 0):08x}"


def stamp(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as this process saves it: with its ``rank``, ``world_size`` and the
    ``digest`` that ties them to the rest (NOTE [ A state must fit its loader ])."""
    rank, world_size = _place()
    stamped = {**state, "rank": rank, "world_size": world_size}
    stamped["digest"] = _digest(stamped)
    return stamped


_PER_RANK_DCP = (
    "torch.distributed.checkpoint keeps one copy of each value that every rank saves under "
    "the same key, taken from any rank, so dcp.save({'loader': loader}) gives every rank a "
    "mix of the ranks' states: save each rank's under its own key, "
    "dcp.save({f'loader_rank{rank}': loader, ...}) and dcp.load({f'loader_rank{rank}': "
    "loader, ...}) with rank = torch.distributed.get_rank(). With another checkpointer, save "
    "each rank's loader.state_dict() and load it on the same rank."
)


def check_rank(state: dict[str, Any]) -> None:
    """Refuse a state that is not this rank's (NOTE [ A state must fit its loader ]): a mix of
    several ranks' states, or another rank's of this world size. Run before any of it is
    applied."""
    saved_rank, saved_world = state.get("rank"), state.get("world_size")
    if saved_world is None:
        return  # saved by an older stoker, or where no consistent rank was known
    digest = state.get("digest")
    if saved_world > 1 and digest is not None and digest != _digest(state):
        raise ValueError(
            f"load_state_dict: this state is not the state of one rank: its fields do not "
            f"match the digest rank {saved_rank} of {saved_world} saved with them, so some "
            "come from another rank (or were edited). A loader's state belongs to the rank "
            "that saved it (the base seed and generator states it drew, its workers' and "
            "dataset's progress). " + _PER_RANK_DCP
        )
    rank, world_size = _place()
    if saved_rank is None or world_size != saved_world or rank == saved_rank:
        return
    # A whole state of another rank is warned about, not refused: Lightning saves rank 0's
    # checkpoint and loads it on every rank, and where all ranks seeded alike (seed_everything)
    # that resume is right. A mix of ranks (above) is never right.
    warnings.warn(
        f"load_state_dict: this state was saved by rank {saved_rank} of {saved_world}, and this "
        f"process is rank {rank} of {saved_world}. A loader's state belongs to the rank that "
        "saved it (the base seed and generator states it drew, its workers' and dataset's "
        f"progress): loaded here, rank {rank} goes on with rank {saved_rank}'s seeds, which is "
        "right only if every rank seeded its loader alike. " + _PER_RANK_DCP,
        stacklevel=3,
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
