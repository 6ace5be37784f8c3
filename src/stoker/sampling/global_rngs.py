"""Exact snapshots of the process-wide RNGs in microseconds: ``random``, numpy's global
``RandomState`` and torch's default CPU generator.

NOTE [ Raw RNG snapshots ]
With ``num_workers=0`` every batch reseeds the global RNGs (the guarantee in docs/resume.md)
and must leave the caller's streams as they were, so their states are saved and restored
around each batch; the concurrency and vectorisation probes compare them around a fetch.
Through the public API that costs ~300 us per batch: ``np.random.get_state``/``set_state``
build and parse a 624-word array (~110 + ~150 us), ``random.getstate``/``setstate`` a tuple of
625 ints (~30 + ~10 us). For a batch of 32 cheap samples that was more than the samples.

Both states are plain memory: numpy's MT19937 words and position at the bit generator's public
``ctypes.state_address``, plus the legacy Gaussian cache (``has_gauss``, ``gauss``) inside the
``RandomState`` object; ``random``'s 624 words and index inside its C object, plus the
``gauss_next`` attribute. Copying those bytes is ~2 us. Where they live inside the objects is
not public, so it is found at the first snapshot (not at import) on private instances, by
searching each object's memory for a state just set through the public API, and then checked:
bytes copied out and back must reproduce the public state and the same draws. If anything does
not check out (another Python or numpy, a subclass), that RNG uses the public API as before.
torch's state is 5 KiB behind ``get_rng_state``/``set_rng_state`` (~5 us): used as is.
"""

from __future__ import annotations

import ctypes
import random
import struct
from typing import Any

import numpy as np
import torch

from stoker.sampling import raw_rng_states
from stoker.sampling.raw_rng_states import MT_WORDS, numpy_raw, numpy_restore

_MT_WORDS = MT_WORDS
# Module globals, so a test can take the public path: None there. Found at the first snapshot.
_ASK: Any = "found at first use"
_RANDOM_OFFSET: Any = _ASK
_NUMPY_GAUSS_OFFSET: Any = _ASK


def _random_offset() -> int | None:
    global _RANDOM_OFFSET
    if _RANDOM_OFFSET is _ASK:
        _RANDOM_OFFSET = raw_rng_states.random_offset()
    return _RANDOM_OFFSET  # type: ignore[no-any-return]


def _numpy_gauss_offset() -> int | None:
    global _NUMPY_GAUSS_OFFSET
    if _NUMPY_GAUSS_OFFSET is _ASK:
        _NUMPY_GAUSS_OFFSET = raw_rng_states.numpy_gauss_offset()
    return _NUMPY_GAUSS_OFFSET  # type: ignore[no-any-return]


# -- snapshots ---------------------------------------------------------------------------------


def _module_random() -> tuple[Any, int] | None:
    """The ``random.Random`` behind the module functions (if they still are its methods) and
    the address of its state words, when they can be copied raw."""
    inst = getattr(random.random, "__self__", None)
    offset = _random_offset()
    if offset is None or type(inst) is not random.Random:
        return None
    return inst, id(inst) + offset


def _random_state(raw: bool = True) -> Any:
    found = _module_random() if raw else None
    if found is None:
        return random.getstate()
    inst, address = found
    return ctypes.string_at(address, 4 + 4 * _MT_WORDS), vars(inst)["gauss_next"]


def _set_random_state(state: Any) -> None:
    if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], bytes)):
        random.setstate(state)
        return
    raw, gauss_next = state
    found = _module_random()
    if found is None:  # random.random was replaced since: the same state, the public way
        index, *words = struct.unpack(f"=i{_MT_WORDS}I", raw)
        random.setstate((3, (*words, index), gauss_next))
        return
    inst, address = found
    ctypes.memmove(address, raw, len(raw))
    inst.gauss_next = gauss_next


def _numpy_global() -> Any:
    return np.random.mtrand._rand


def _numpy_state(raw: bool = True) -> Any:
    rs = _numpy_global()
    offset = _numpy_gauss_offset() if raw else None
    if (
        offset is not None
        and type(rs) is np.random.RandomState
        and type(rs._bit_generator) is np.random.MT19937
    ):
        return numpy_raw(rs, offset)
    return rs.get_state()


def _set_numpy_state(state: Any) -> None:
    rs = _numpy_global()
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], bytes):
        offset = _numpy_gauss_offset()
        assert offset is not None
        numpy_restore(rs, offset, state)
    else:
        rs.set_state(state)


def snapshot(raw: bool = True) -> tuple[Any, Any, torch.Tensor]:
    """The states of ``random``, numpy's global RNG and torch's default CPU generator;
    ``raw=False``: through the public APIs only (NOTE [ One switch for the fast paths ])."""
    return _random_state(raw), _numpy_state(raw), torch.get_rng_state()


def restore(state: tuple[Any, Any, torch.Tensor]) -> None:
    """Put back a ``snapshot()``: the next draws are those that followed it."""
    py, nps, ts = state
    _set_random_state(py)
    _set_numpy_state(nps)
    torch.set_rng_state(ts)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        if a and isinstance(a[0], bytes):
            return a == b  # raw copies
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def changed_since(state: tuple[Any, Any, torch.Tensor]) -> bool:
    """Whether any of the three RNGs drew (or was reseeded) since ``state`` was taken."""
    py, nps, ts = state
    return (
        not _same(_random_state(), py)
        or not _same(_numpy_state(), nps)
        or not torch.equal(torch.get_rng_state(), ts)
    )


def raw_paths() -> dict[str, bool]:
    """Which RNGs are copied as raw bytes here (the rest use the public API)."""
    return {"random": _random_offset() is not None, "numpy": _numpy_gauss_offset() is not None}
