"""Snapshot and restore the random generators a sampler draws an epoch's order from.

An epoch's order is fixed by the generator states at the moment the iterator is created:
the loader's ``generator`` (or torch's global RNG when there is none: ``RandomSampler`` and the
base seed then draw from it) and any ``torch.Generator`` a sampler keeps as an attribute.
Saving those states is enough to recompute the order later without fetching anything.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import torch


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
    """The generator states an epoch starts from, captured raw and encoded only when asked."""

    def __init__(self, loader_generator: torch.Generator | None, index_sampler: Any) -> None:
        self._loader_generator = loader_generator
        self._named = {
            k: g for k, g in sampler_generators(index_sampler).items() if g is not loader_generator
        }
        self._raw: dict[str, torch.Tensor] = {}
        self._encoded: dict[str, str] | None = None

    def capture(self) -> None:
        raw = {k: g.get_state() for k, g in self._named.items()}
        if self._loader_generator is not None:
            raw["generator"] = self._loader_generator.get_state()
        else:
            raw["global_torch"] = torch.get_rng_state()
        self._raw, self._encoded = raw, None

    def encoded(self) -> dict[str, str]:
        if self._encoded is None:
            self._encoded = {k: _encode(v) for k, v in self._raw.items()}
        return self._encoded

    def encoded_with_save_point(self) -> dict[str, str]:
        """The epoch-start states, plus torch's global RNG now when the epoch drew from it."""
        encoded = self.encoded()
        if "global_torch" not in encoded:
            return encoded
        return {**encoded, "global_torch_at_save": _encode(torch.get_rng_state())}

    def encoded_unsaved(self) -> dict[str, str]:
        """The state of an epoch not begun: the same keys, with no save point ("")."""
        encoded = self.encoded()
        if "global_torch" not in encoded:
            return encoded
        return {**encoded, "global_torch_at_save": ""}

    @contextlib.contextmanager
    def restored(self, encoded: dict[str, str]) -> Iterator[None]:
        """Put the saved states back for the epoch's draws.

        The loader's and the samplers' generators keep the restored state (the rest of the run
        continues from there, as it did originally). So does torch's global RNG (the source
        when the loader has no ``generator``): after the epoch's draws it is set to its state
        at the save point, so the following epochs draw what they drew in the original run.
        """
        at_save = encoded.get("global_torch_at_save")
        encoded = {k: v for k, v in encoded.items() if k != "global_torch_at_save"}
        self._raw = {k: _decode(v) for k, v in encoded.items()}
        self._encoded = dict(encoded)
        for key, generator in self._named.items():
            if key in self._raw:
                generator.set_state(self._raw[key])
        if self._loader_generator is not None and "generator" in self._raw:
            self._loader_generator.set_state(self._raw["generator"])
        if "global_torch" in self._raw:
            torch.set_rng_state(self._raw["global_torch"])
        try:
            yield
        finally:
            # A mid-epoch state: the global RNG as it was when the state was saved. A state of
            # an epoch not begun: its save point is the epoch start, so the epoch's draws leave
            # the global RNG where they left it originally (its save point is "": the key is
            # there all the same, so the state's keys never change; see ``encoded_unsaved``).
            if at_save:
                torch.set_rng_state(_decode(at_save))
