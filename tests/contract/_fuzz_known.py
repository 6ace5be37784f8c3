"""Differences from torch the fuzzer found that still occur: each one a named switch.

While a name is in ``KNOWN_DIFFERENCES``, the fuzzer leaves out the one generated feature or
recorded detail that shows it (``masked(name)``), so that the bounded run stays green and
keeps finding *new* differences; ``test_known_difference_still_occurs`` runs each entry's
minimal case with that one switch off as a strict xfail, so the day stoker matches torch
there, that test fails (XPASS) and says to delete the entry. ``STOKER_FUZZ_UNMASK=a,b``
turns the named switches off, ``STOKER_FUZZ_STRICT=1`` all of them (the full comparison,
e.g. ``STOKER_FUZZ_STRICT=1 pytest tests/contract/test_differential_fuzz.py -m soak``).

Each entry: what the fuzzer observed, torch's behaviour first, and what the switch leaves out.
"""

from __future__ import annotations

import os

STRICT_ENV = "STOKER_FUZZ_STRICT"
UNMASK_ENV = "STOKER_FUZZ_UNMASK"  # comma-separated names: turn just these switches off

KNOWN_DIFFERENCES: dict[str, str] = {
    "worker_exceptions": (
        "an exception raised in a worker (__getitem__, __iter__, collate_fn, including "
        "default_collate's own TypeError) comes back as the original object: torch raises "
        "type(e)('Caught <T> in DataLoader worker process <k>.\\nOriginal Traceback ...') "
        "(RuntimeError when the type cannot be built from one string, and then stoker raises "
        "torch's too, the original as its __cause__; message= when it has a "
        "message attribute); where the type is the same, the "
        "attributes differ (torch's come from the constructor's defaults: code=0 vs 42), the "
        "message has neither torch's header nor its traceback, __cause__ is a "
        "RemoteTraceback with __suppress_context__ True. Masked: such exceptions are "
        "recorded as what both keep: the type raised, the original type's name, its "
        "message, the worker id."
    ),
    "exception_notes": (
        "an exception from the user's code gets __notes__ ('stoker: raised in the main "
        "process (num_workers=0) while loading sample index 1.'), printed under its "
        "traceback; torch's has none. Masked: __notes__ is not recorded."
    ),
    "stop_iteration_in_map_style": (
        "StopIteration raised by a map-style dataset's __getitem__ (or a collate_fn) ends "
        "torch's epoch silently (with or without workers; with workers the StopIteration "
        "says 'Caught StopIteration in DataLoader worker process k'); stoker raises "
        "RuntimeError('StopIteration raised by the map-style dataset (or collate_fn) ...'). "
        "Masked: no StopIteration from map-style datasets and their collate_fn."
    ),
}


def masked(name: str) -> bool:
    """True while difference ``name`` is known and the fuzzer should step around it."""
    if name not in KNOWN_DIFFERENCES:
        return False
    if name in os.environ.get(UNMASK_ENV, "").split(","):
        return False
    return os.environ.get(STRICT_ENV, "").strip() in ("", "0")
