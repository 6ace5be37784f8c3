"""Freeze what a pytest process holds once collection is done (``gc.freeze``).

Why: a pytest process holds torch, hypothesis, the collected items of ~3,200 tests and the
modules they import: about a million tracked objects. Every full collection (automatic ones as
tests allocate, and the leak checks' ``gc.collect()``) walked all of them, writing each one's
GC header; with a worker forked, each of those writes also copies a page (copy-on-write).
`perf record -a` over the fast tier put ~11 % of the machine's samples in the pytest processes'
collector. Frozen, a collection walks only what the tests made since.

What stays true: nothing frozen here is garbage a test waits for (a loader, its workers, a
server are all made by tests, after the freeze); torch and stoker see the same frozen state,
so a comparison between them is not changed; the probes that compare the freeze itself run in
a fresh interpreter (tests/integration/_process_probe.py). ``gc.get_freeze_count()`` walks
every frozen object: a test should not call it per sample. A test that calls
``gc.unfreeze()`` itself ends the saving for the rest of its process, nothing else.
"""

from __future__ import annotations

import gc


def freeze_collected() -> None:
    """Collect once, then move every object that survives into the permanent generation."""
    gc.collect()
    gc.freeze()
