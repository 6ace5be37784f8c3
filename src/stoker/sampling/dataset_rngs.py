"""Random generators a dataset owns (created in ``__init__``), reseeded per batch.

torch gives every worker an identical copy of the dataset, so ``self.rng =
np.random.default_rng(0)`` draws the same numbers in every worker: augmentations repeat
across workers, and change with ``num_workers``. With ``seeding="per_batch"`` stoker reseeds
such generators before each batch from (base seed, epoch, position), like the global RNGs; in
the main process their states are put back afterwards. With ``seeding="per_worker"`` (torch's
behaviour) it says so, naming the attribute and the fix: in ``loader.stats().advice`` and, at
DEBUG, on the ``stoker.sampling.dataset_rngs`` logger (once per dataset); not through
``warnings`` nor on stderr, where torch says nothing (NOTE [ torch's voice ] and NOTE [ Advice
is quiet ] in ``_core/torch_voice.py``).
"""

from __future__ import annotations

import logging
import random
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stoker._core.torch_voice import ADVICE_LEVEL
from stoker._core.walk import iter_attributes
from stoker.sampling.datapipes import is_datapipe
from stoker.sampling.seeds import mix_seed

log = logging.getLogger(__name__)


def _rng_types() -> tuple[type, ...]:
    """numpy's generator classes only once ``numpy.random`` is loaded: no dataset holds one
    before, and loading it for nothing costs ~5 ms (NOTE [ Import only what the loader needs ])."""
    nprandom = sys.modules.get("numpy.random")
    if nprandom is None:
        return random.Random, torch.Generator
    return random.Random, nprandom.Generator, nprandom.RandomState, torch.Generator


def find_dataset_rngs(dataset: Any) -> list[tuple[str, Any]]:
    if is_datapipe(dataset):
        return []  # its shufflers take the loader's shared seed (stoker.sampling.datapipes)
    found = []
    seen: set[int] = set()
    rng_types = _rng_types()
    for path, value in iter_attributes(dataset):
        if isinstance(value, rng_types) and id(value) not in seen:
            if isinstance(value, torch.Generator) and value.device.type != "cpu":
                continue
            seen.add(id(value))
            found.append((path, value))
    return found


def _seed_of(seed: int, k: int) -> int:
    return mix_seed(seed, 100 + k) >> 1


def reseed(rngs: list[tuple[str, Any]], seed: int) -> None:
    for k, (_, rng) in enumerate(rngs):
        s = _seed_of(seed, k)
        if isinstance(rng, torch.Generator):
            rng.manual_seed(s)
        elif isinstance(rng, random.Random):  # before numpy's: no numpy.random to load for it
            rng.seed(s)
        elif isinstance(rng, np.random.Generator):
            rng.bit_generator.state = type(rng.bit_generator)(s).state
        else:  # np.random.RandomState
            rng.seed(s & 0xFFFFFFFF)


def save_states(rngs: list[tuple[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for _, rng in rngs:
        if isinstance(rng, torch.Generator):
            out.append(rng.get_state())
        elif isinstance(rng, random.Random):
            out.append(rng.getstate())
        elif isinstance(rng, np.random.Generator):
            out.append(rng.bit_generator.state)
        else:  # np.random.RandomState
            out.append(rng.get_state())
    return out


def restore_states(rngs: list[tuple[str, Any]], states: list[Any]) -> None:
    for (_, rng), state in zip(rngs, states, strict=True):
        if isinstance(rng, torch.Generator):
            rng.set_state(state)
        elif isinstance(rng, random.Random):
            rng.setstate(state)
        elif isinstance(rng, np.random.Generator):
            rng.bit_generator.state = state
        else:  # np.random.RandomState
            rng.set_state(state)


_told: weakref.WeakSet[Any] = weakref.WeakSet()


def tell_shared_rngs(
    dataset: Any, rngs: list[tuple[str, Any]], num_workers: int, advise: Callable[[str], object]
) -> None:
    """seeding="per_worker": every worker gets an identical copy of these generators. Said to
    ``advise`` (the loader's stats) and, once per dataset, at ``ADVICE_LEVEL`` on this module's
    logger."""
    if not rngs:
        return
    path, rng = rngs[0]
    text = (
        f"stoker: {path} is a {type(rng).__module__}.{type(rng).__name__} created before the "
        f"workers started; each of the {num_workers} workers gets an identical copy, so the "
        "random draws from it repeat across workers, as under torch. Draw from "
        "stoker.sample_rng() in __getitem__ instead, or pass seeding='per_batch' (or "
        "beyond_torch={'per_batch_seeding'}), which reseeds it per batch."
    )
    advise(text)
    try:
        if dataset in _told:
            return
        _told.add(dataset)
    except TypeError:  # not weak-referenceable: said every time rather than never
        pass
    log.log(ADVICE_LEVEL, "%s", text)
