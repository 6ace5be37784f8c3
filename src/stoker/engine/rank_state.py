"""Which rank a loader's state belongs to, and every rank's part of it (NOTE [ A state must fit
its loader ] in ``engine.state_fit``).

NOTE [ Every rank's part ]
A loader's state belongs to the rank that saved it: the base seed and generator states it drew,
its workers' streams, its dataset's progress. Frameworks save one state for all ranks: Lightning
writes rank 0's checkpoint and loads it on every rank; Accelerate's ``save_state`` has every rank
write one shared ``dl_state_dict.bin``; ``torch.distributed.checkpoint`` keeps one copy of each
value saved under one key, each value's copy from any rank (a mix). Loaded as it is, a rank goes
on with another rank's seeds: exact only where the ranks' parts happened to be alike.

So where the framework's save runs on every rank at once (Lightning's ``dump_checkpoint``, which
``stoker.integrations.lightning`` wraps), the ranks' states are gathered
(``stoker.integrations.rank_parts``) and the state saved is rank 0's with ``"ranks"``: per rank,
only the fields that differ between ranks (seeds, worker streams, the rank and the digest;
positions and the loader's description are alike and kept once), so it stays small. Loading it,
each rank takes the common fields and its own part, checked against the digest it saved: exact
on every rank, whichever rank's copy (or DCP mix of copies) it got, and silent. Accelerate's
``save_state`` may run on the main process alone, where a collective would hang: there each
rank keeps its own state in a file of its own instead (NOTE [ Accelerate's one loader file ]).

A state without this rank's part is checked as before: a multi-rank state whose fields do not
match its digest (a mix) is refused; another rank's whole state is refused under DCP (the
per-rank keys are the fix) and warned about elsewhere (it is right only if the ranks seeded
alike, which stoker cannot see). The advice names the framework on the stack.

Keys that start with ``_`` are a framework's (Accelerate adds ``_iterator_finished``; torchdata's
keys all start so): the digest leaves them out, and loading drops them. stoker's own keys never
start with ``_``.
"""

from __future__ import annotations

import sys
import warnings
import zlib
from typing import Any

from stoker.distributed.context import detect

_UNDIGESTED = ("digest", "ranks")


def own_keys(state: dict[str, Any]) -> list[str]:
    """stoker's fields of ``state``: not a framework's ``_`` keys (NOTE [ Every rank's part ])."""
    return [k for k in state if not (isinstance(k, str) and k.startswith("_"))]


def place() -> tuple[int | None, int | None]:
    """This process's rank and world size, or (None, None) where they are not consistent."""
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


def digest(state: dict[str, Any]) -> str:
    """A digest of stoker's fields but ``digest`` and ``ranks``: it matches only one rank's
    whole state (a check against mixing, not against tampering)."""
    fields = {k: state[k] for k in own_keys(state) if k not in _UNDIGESTED}
    return f"{_crc(fields, 0):08x}"


def stamp(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as this process saves it: stoker's fields, with its ``rank``, ``world_size``
    and the ``digest`` that ties them to the rest."""
    rank, world_size = place()
    stamped = {k: state[k] for k in own_keys(state) if k not in _UNDIGESTED}
    stamped.update(rank=rank, world_size=world_size)
    stamped["digest"] = digest(stamped)
    return stamped


def with_ranks(states: list[Any]) -> dict[str, Any] | None:
    """Rank 0's state with every rank's part (NOTE [ Every rank's part ]), from ``states``, the
    stamped states of ranks 0..n-1 of one loader; None where they are not that."""
    n = len(states)
    if n < 2 or not all(isinstance(s, dict) and s.get("rank") == r and s.get("world_size") == n
                        for r, s in enumerate(states)):
        return None
    keys = [k for k in own_keys(states[0]) if k != "ranks"]
    if any(sorted(map(str, own_keys(s))) != sorted(map(str, keys)) for s in states):
        return None
    differ = [k for k in keys if len({_crc(s[k], 0) for s in states}) > 1]
    return {**states[0], "ranks": [{k: s[k] for k in differ} for s in states]}


def _own_part(state: dict[str, Any], rank: int, world_size: int) -> dict[str, Any] | None:
    """This rank's whole state from the common fields and its part, if it checks out."""
    parts = state.get("ranks")
    if not isinstance(parts, list) or len(parts) != world_size or not isinstance(
            parts[rank], dict):
        return None
    mine = {k: state[k] for k in own_keys(state) if k != "ranks"}
    mine.update(parts[rank])
    if mine.get("rank") != rank or mine.get("digest") != digest(mine):
        return None
    return mine


def framework() -> str | None:
    """The framework whose code is loading the state: 'dcp', 'accelerate', 'lightning' or None
    (read from the stack, to give advice that fits)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.startswith("torch.distributed.checkpoint"):
            return "dcp"
        if name.startswith("accelerate."):
            return "accelerate"
        if name.startswith(("lightning.", "pytorch_lightning.")):
            return "lightning"
        frame = frame.f_back  # type: ignore[assignment]
    return None


_ADVICE = {
    "dcp": (
        "torch.distributed.checkpoint keeps one copy of each value that every rank saves under "
        "the same key, taken from any rank, so dcp.save({'loader': loader}) gives every rank a "
        "mix of the ranks' states: save each rank's under its own key, "
        "dcp.save({f'loader_rank{rank}': loader, ...}) and dcp.load({f'loader_rank{rank}': "
        "loader, ...}) with rank = torch.distributed.get_rank()."
    ),
    "lightning": (
        "Lightning loads rank 0's checkpoint on every rank; stoker records every rank's part in "
        "it when Trainer.save_checkpoint runs on all ranks (as ModelCheckpoint does), and this "
        "checkpoint has none (saved another way, or by an older stoker). Save it with "
        "trainer.save_checkpoint on every rank, or call seed_everything(seed, workers=False) so "
        "that the ranks' loader states are alike."
    ),
    "accelerate": (
        "Accelerate's save_state writes one loader state for all ranks; stoker keeps each "
        "rank's own beside it (stoker_dl_state_dict_rank<r>.bin) where save_state() runs on that "
        "rank, and this rank has none (save_state() called on the main process alone, or by an "
        "older stoker). Call accelerator.save_state() on every process."
    ),
    None: "Save each rank's loader.state_dict() and load it on the same rank.",
}
_WHOSE = (
    "A loader's state belongs to the rank that saved it (the base seed and generator states it "
    "drew, its workers' and dataset's progress)"
)


def check_rank(state: dict[str, Any]) -> dict[str, Any]:
    """The state this rank applies: its own, from every rank's parts where the state has them;
    else ``state`` (without a framework's keys) if it is this rank's, refused if it is a mix
    of ranks' states (or another rank's, under DCP), warned about if it is another rank's whole
    state (NOTE [ Every rank's part ]). Run before any of it is applied."""
    saved_rank, saved_world = state.get("rank"), state.get("world_size")
    rank, world_size = place()
    if saved_world is not None and world_size == saved_world and rank is not None:
        mine = _own_part(state, rank, saved_world)
        if mine is not None:
            return mine
    own = {k: state[k] for k in own_keys(state) if k != "ranks"}
    if saved_world is None:
        return own  # saved by an older stoker, or where no consistent rank was known
    path = framework()
    saved_digest = state.get("digest")
    if saved_world > 1 and saved_digest is not None and saved_digest != digest(own):
        raise ValueError(
            f"load_state_dict: this state is not the state of one rank: its fields do not "
            f"match the digest rank {saved_rank} of {saved_world} saved with them, so some "
            f"come from another rank (or were edited). {_WHOSE}. {_ADVICE[path]}"
        )
    if saved_rank is None or world_size != saved_world or rank == saved_rank:
        return own
    another = (
        f"load_state_dict: this state was saved by rank {saved_rank} of {saved_world} and has "
        f"no part for this process, rank {rank}. {_WHOSE}: loaded here, rank {rank} would go on "
        f"with rank {saved_rank}'s seeds, which is right only if every rank seeded its loader "
        f"alike. {_ADVICE[path]}"
    )
    if path == "dcp":
        raise ValueError(another)
    warnings.warn(another, stacklevel=3)
    return own
