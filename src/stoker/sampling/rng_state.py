"""Snapshot and restore the random generators a sampler draws an epoch's order from.

An epoch's order is fixed by the generator states at the moment the iterator is created:
the loader's ``generator`` (or torch's global RNG when there is none: ``RandomSampler`` and the
base seed then draw from it) and any ``torch.Generator`` a sampler keeps as an attribute.
Saving those states is enough to recompute the order later without fetching anything.

NOTE [ Main streams resume ]
Under torch's per-worker seeding with ``num_workers=0`` (torch's default), samples draw their
random augmentations from the main process's own global RNGs (``random``, numpy's, torch's),
interleaved with the script's own draws (dropout, its augmentations), as under torch. Each
batch then depends on everything drawn before it, so recomputing the epoch's order and
skipping the delivered positions is not enough. Such a loader's snapshot (``main_rngs=True``)
also keeps the three global RNG states, in ``sampling.worker_rngs``' form (raw copies taken in
a few microseconds, encoded as one base64 string when a state is asked for):

* ``globals``: at the epoch start, put back before the epoch's draws (a sampler that shuffles
  with ``random`` or numpy draws its order again);
* ``globals_at_save``: when ``state_dict()`` was called (after the last delivered batch and
  whatever the script drew since), put back once the resumed iterator has recomputed the
  epoch's order and base seed: the rest of the epoch and the script's draws after it are those
  of the uninterrupted run. A state of an epoch not begun has ``""`` here (its save point is
  the epoch start, ``globals``), so the keys never change (NOTE [ Constant state keys ]).

Two draws keep their place. An IterableDataset cannot seek: its delivered batches are read
again (or its iterator's state loaded, which may read them) from the epoch start's states, as
they were first read, and the save point's come back before the first batch after them
(``hold_save_point``; a ``state_dict()`` meanwhile still records the loaded save point). And a
state taken between ``iter()`` and the first batch, without workers: the sampler's first draw
(a ``RandomSampler`` without a generator draws its seed from torch's global RNG at its first
``next()``) came after it, so the resumed iterator draws it after the save point is back too
(the state's ``sampler_started``, ``BaseIterator._skip_delivered``; workers send their first
tasks at ``iter()``, so theirs came before it). This holds for torch's global RNG under
per-batch seeding as well.

Per-batch seeding needs none of it (each batch reseeds the global RNGs and puts the script's
streams back). The loader keeps no batch ahead of the script in this case (``device=``
copies each batch when asked for, ``device.attach``): a batch fetched ahead would draw before
the script's step does, which torch never does. A state saved here loads at another
``num_workers`` only before anything was delivered (NOTE [ Worker streams resume ]); an
iterator that does not keep the main streams ignores them, and one that does but loads a state
without them starts from the global RNGs as they are.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from stoker.sampling import global_rngs, worker_rngs

_MAIN = "globals"  # NOTE [ Main streams resume ]
_MAIN_AT_SAVE = "globals_at_save"
_AT_SAVE = ("global_torch_at_save", _MAIN_AT_SAVE)


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def sampler_generators(index_sampler: Any) -> dict[str, torch.Generator]:
    """``torch.Generator`` attributes of the (batch) sampler and the sampler it wraps."""
    found: dict[str, torch.Generator] = {}
    inner = getattr(index_sampler, "sampler", None)
    for path, obj in (("batch_sampler", index_sampler), ("sampler", inner)):
        attrs = vars(obj) if obj is not None and hasattr(obj, "__dict__") else {}
        for name, value in attrs.items():
            if isinstance(value, torch.Generator) and value.device.type == "cpu":
                found[f"{path}.{name}"] = value
    return found


class RngSnapshot:
    """The generator states an epoch starts from, captured raw and encoded only when asked;
    with ``main_rngs``, the main process's global RNGs too (NOTE [ Main streams resume ])."""

    def __init__(self, loader_generator: torch.Generator | None, index_sampler: Any,
                 main_rngs: bool = False) -> None:
        self._loader_generator = loader_generator
        self._named = {
            k: g for k, g in sampler_generators(index_sampler).items() if g is not loader_generator
        }
        self._raw: dict[str, torch.Tensor] = {}
        self._encoded: dict[str, str] | None = None
        self._main_rngs = main_rngs
        self._main: Any = None  # the global RNGs at the epoch start (``worker_rngs`` form)
        self._at_save: tuple[Any, str] | None = None  # the last save point taken, encoded
        # Save-point states of a resume not put back yet (``hold_save_point``).
        self._pending: tuple[str | None, str | None] | None = None
        self.held = False
        self._numpy_pending = False  # ``_main`` has numpy's part absent, to fill once loaded

    def capture(self) -> None:
        raw = {k: g.get_state() for k, g in self._named.items()}
        if self._loader_generator is not None:
            raw["generator"] = self._loader_generator.get_state()
        else:
            raw["global_torch"] = torch.get_rng_state()
        self._raw, self._encoded = raw, None
        if self._main_rngs:
            self._main = global_rngs.take()
            self._numpy_pending = global_rngs.watch_absent_numpy(self._main)

    def encoded(self) -> dict[str, str]:
        if self._encoded is None:
            self._encoded = {k: _encode(v) for k, v in self._raw.items()}
            if self._main_rngs:
                self._encoded[_MAIN] = worker_rngs.encode(self._main)
        if self._numpy_pending:
            # numpy.random not loaded when the epoch started (NOTE [ numpy's RNG loads when
            # the program loads it ]): the epoch started from the state it loads with, loaded
            # now if the program has not yet (a state asked for is stoker's, not torch's)
            global_rngs.load_numpy()
            at_load = global_rngs.numpy_at_load()
            if at_load is not None:
                self._main = self._encoded[_MAIN] = worker_rngs.encode(self._main, at_load)
                self._numpy_pending = False
        return self._encoded

    def encoded_with_save_point(self) -> dict[str, str]:
        """The epoch-start states, plus the global RNGs the epoch draws from as they are now:
        torch's when the epoch's order drew from it, all three with ``main_rngs``."""
        encoded = self.encoded()
        # Held back (``hold_save_point``): the loaded state's save point is still the one.
        torch_held, main_held = self._pending if self.held and self._pending else (None, None)
        at_save: dict[str, str] = {}
        if "global_torch" in encoded:
            at_save["global_torch_at_save"] = (
                _encode(torch.get_rng_state()) if torch_held is None else torch_held)
        if self._main_rngs:
            at_save[_MAIN_AT_SAVE] = self._main_now() if main_held is None else main_held
        return {**encoded, **at_save} if at_save else encoded

    def _main_now(self) -> str:
        """The global RNGs now, encoded; a state asked for at every step without a draw in
        between (a dataset that draws nothing) encodes them once."""
        now = global_rngs.take()
        if self._at_save is None or self._at_save[0] != now:
            self._at_save = (now, worker_rngs.encode(now))
        return self._at_save[1]

    def encoded_unsaved(self) -> dict[str, str]:
        """The state of an epoch not begun: the same keys, with no save point ("")."""
        encoded = self.encoded()
        unsaved = {k: "" for k, present in (("global_torch_at_save", "global_torch" in encoded),
                                             (_MAIN_AT_SAVE, self._main_rngs)) if present}
        return {**encoded, **unsaved} if unsaved else encoded

    @contextlib.contextmanager
    def restored(self, encoded: dict[str, str]) -> Iterator[None]:
        """Put the saved states back for the epoch's draws.

        The loader's and the samplers' generators keep the restored state (the rest of the run
        continues from there, as it did originally). So does torch's global RNG (the source
        when the loader has no ``generator``): after the epoch's draws it is set to its state
        at the save point, so the following epochs draw what they drew in the original run.
        With ``main_rngs`` all three global RNGs are, likewise (NOTE [ Main streams resume ]).
        """
        at_save = encoded.get("global_torch_at_save")
        main_at_save = encoded.get(_MAIN_AT_SAVE) if self._main_rngs else None
        main = encoded.get(_MAIN) if self._main_rngs else None
        encoded = {k: v for k, v in encoded.items() if k not in (*_AT_SAVE, _MAIN)}
        self._raw = {k: _decode(v) for k, v in encoded.items()}
        self._encoded = dict(encoded)
        if self._main_rngs:
            if main:
                worker_rngs.restore(worker_rngs.decode(main))
            # A state saved without them (by a loader that did not keep them): the epoch
            # starts from the global RNGs as they are.
            self._main = main or global_rngs.take()
            self._encoded[_MAIN] = worker_rngs.encode(self._main)
            self._numpy_pending = global_rngs.watch_absent_numpy(self._main)
        for key, generator in self._named.items():
            if key in self._raw:
                generator.set_state(self._raw[key])
        if self._loader_generator is not None and "generator" in self._raw:
            self._loader_generator.set_state(self._raw["generator"])
        if "global_torch" in self._raw:
            torch.set_rng_state(self._raw["global_torch"])
        self._pending, self.held = (at_save, main_at_save), False
        try:
            yield
        finally:
            # A mid-epoch state: the global RNG as it was when the state was saved. A state of
            # an epoch not begun: its save point is the epoch start, so the epoch's draws leave
            # the global RNG where they left it originally (its save point is "": the key is
            # there all the same, so the state's keys never change; see ``encoded_unsaved``).
            if not self.held:
                self.release_save_point()

    def hold_save_point(self) -> None:
        """With ``main_rngs``: keep the save point back when the epoch's draws end, for an
        iterable brought up to it (its delivered batches read again, or its iterator's state
        loaded, draw from the global RNGs as they did from the epoch start);
        ``release_save_point`` puts it back before the first batch after it is read."""
        self.held = self._main_rngs

    def release_save_point(self) -> None:
        """Put the global RNGs back at the loaded state's save point (once)."""
        pending, self._pending, self.held = self._pending, None, False
        if pending is None:
            return
        at_save, main_at_save = pending
        if at_save:
            torch.set_rng_state(_decode(at_save))
        if main_at_save:
            worker_rngs.restore(worker_rngs.decode(main_at_save))


def check_main_rngs(rng: Any) -> None:
    """Refuse (at ``load_state_dict``) a state whose main-process RNG states (NOTE [ Main
    streams resume ]) are not ones ``state_dict()`` wrote."""
    if not isinstance(rng, dict):
        return
    for key in (_MAIN, _MAIN_AT_SAVE):
        text = rng.get(key)
        if text is not None and text != "":
            worker_rngs.check_saved(text, f"state['rng'][{key!r}]",
                                    "the main process's global RNG states")
