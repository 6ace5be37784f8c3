"""Raw copies of ``random``'s and numpy's global RNG states (NOTE [ Raw RNG snapshots ] in
``stoker.sampling.global_rngs``): where the states live inside the objects is found on private
instances the first time a snapshot asks, and checked by round trips; not at import, where
numpy's RNG module is not loaded yet (NOTE [ Import only what the loader needs ]). A fast path
that relies on CPython's and numpy's object layouts, under
NOTE [ One switch for the fast paths ] (``stoker.fastpaths.switch``) but kept here, beside the
snapshots that use it: with ``STOKER_FAST_PATHS=0`` nothing is calibrated and every state goes
through the public APIs.
"""

from __future__ import annotations

import ctypes
import functools
import random
import struct
from typing import Any

import numpy as np

from stoker._core.fast_paths_env import env_allows

MT_WORDS = 624
_MT_WORDS = MT_WORDS
_MT19937_STATE_BYTES = _MT_WORDS * 4 + 4  # uint32 key[624]; int pos


def _memory(obj: object, nbytes: int) -> bytes:
    return ctypes.string_at(id(obj), nbytes)


def _find(obj: object, nbytes: int, needle: bytes) -> int | None:
    """The one offset of ``needle`` in the first ``nbytes`` of ``obj``'s memory, else None."""
    haystack = _memory(obj, nbytes)
    at = haystack.find(needle)
    return at if at >= 0 and haystack.find(needle, at + 1) < 0 else None


# -- random ------------------------------------------------------------------------------------


def _random_offset() -> int | None:
    """Offset of ``int index; uint32_t state[624]`` in a ``random.Random`` object, checked."""
    import _random

    size = _random.Random.__basicsize__
    probe = random.Random(0x5EED)
    probe.random()
    words = probe.getstate()[1]
    at = _find(probe, size, struct.pack(f"={_MT_WORDS}I", *words[:_MT_WORDS]))
    if at is None or at < 4:
        return None
    offset = at - 4
    if struct.unpack_from("=i", _memory(probe, size), offset)[0] != words[_MT_WORDS]:
        return None
    # Round trip on a second object: copy out, draw, copy back, draw the same again.
    other = random.Random(0xD1CE)
    saved = ctypes.string_at(id(other) + offset, 4 + 4 * _MT_WORDS)
    first = [other.random() for _ in range(700)]  # past a regeneration of the 624 words
    ctypes.memmove(id(other) + offset, saved, len(saved))
    if [other.random() for _ in range(700)] != first:
        return None
    return offset


# -- numpy -------------------------------------------------------------------------------------


def _numpy_gauss_offset() -> int | None:
    """Offset of ``int has_gauss; double gauss`` (16 bytes with padding) in a RandomState."""
    size = type(np.random.mtrand._rand).__basicsize__
    probe = np.random.RandomState(0x5EED)
    state: Any = probe.get_state(legacy=True)
    key, pos = state[1], state[2]
    sentinel = 0.7315926535897932
    probe.set_state(("MT19937", key, pos, 1, sentinel))
    at = _find(probe, size, struct.pack("=d", sentinel))
    if at is None or at < 8:
        return None
    offset = at - 8
    if struct.unpack_from("=i", _memory(probe, size), offset)[0] != 1:
        return None
    probe.set_state(("MT19937", key, pos, 0, 0.0))
    if struct.unpack_from("=i", _memory(probe, size), offset)[0] != 0:
        return None
    # Round trip with a Gaussian cached: raw copies must give the same draws again.
    probe.standard_normal()  # leaves the pair's second value cached
    raw = numpy_raw(probe, offset)
    first = probe.standard_normal(5).tolist() + probe.random_sample(700).tolist()
    numpy_restore(probe, offset, raw)
    if probe.standard_normal(5).tolist() + probe.random_sample(700).tolist() != first:
        return None
    return offset


def numpy_raw(rs: Any, gauss_offset: int) -> tuple[bytes, bytes]:
    address = rs._bit_generator.ctypes.state_address
    with rs._bit_generator.lock:  # the lock RandomState itself takes
        return (
            ctypes.string_at(address, _MT19937_STATE_BYTES),
            ctypes.string_at(id(rs) + gauss_offset, 16),
        )


def numpy_restore(rs: Any, gauss_offset: int, raw: tuple[bytes, bytes]) -> None:
    address = rs._bit_generator.ctypes.state_address
    with rs._bit_generator.lock:  # the lock RandomState itself takes
        ctypes.memmove(address, raw[0], _MT19937_STATE_BYTES)
        ctypes.memmove(id(rs) + gauss_offset, raw[1], 16)


def _calibrated(find: Any) -> int | None:
    try:
        return find()
    except Exception:  # an unexpected layout or API: the public path is used instead
        return None


@functools.cache
def random_offset() -> int | None:
    """Where ``random``'s state lies in its object, found once; None: use the public API."""
    return _calibrated(_random_offset) if env_allows() else None


@functools.cache
def numpy_gauss_offset() -> int | None:
    """Where numpy's Gaussian cache lies in a ``RandomState``, found once; None: public API."""
    return _calibrated(_numpy_gauss_offset) if env_allows() else None


def calibrate() -> None:
    """Find both offsets now (~6 ms): the process about to fork workers does it once, so that
    each worker inherits them instead of finding them again at its first batch."""
    random_offset()
    numpy_gauss_offset()
