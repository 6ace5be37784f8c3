"""A worker's global RNG states as a state dict keeps them, and restored (NOTE [ Worker streams
resume ] in ``stoker.engine.worker_streams``); the main process's, in the same forms, with
``num_workers=0`` (NOTE [ Main streams resume ] in ``stoker.sampling.rng_state``).

Three forms:

* the *wire* form, taken in the worker after every batch by ``global_rngs.take`` (there, so
  that a batch's path stays short): the raw byte copies of NOTE [ Raw RNG snapshots ] plus
  torch's state as bytes, ~10 KB, a few microseconds, and comparable with ``==`` so an
  unchanged state is not sent again. Without the raw copies (``STOKER_FAST_PATHS=0``, another
  interpreter) it is the canonical form at once (``canonical_public``, slower).
* the *canonical* form: one ``bytes`` in a fixed little-endian layout, independent of the
  interpreter's object layout, so a state saved on one machine loads on another;
* the *encoded* form kept in ``state_dict()``: that ``bytes`` in base64 (one JSON string per
  worker, a leaf for checkpointers that descend into dicts).

Restoring goes through the public APIs (``random.setstate``, ``np.random.set_state``,
``torch.set_rng_state``): it runs once per worker start.

numpy's part may be *absent*: a main-process state taken before the program loaded
``numpy.random`` (NOTE [ numpy's RNG loads when the program loads it ] in
``sampling.global_rngs``). The wire form has ``None`` for its two raw copies, the canonical form
position -1 (a Mersenne Twister's is 0..624), and restoring it leaves numpy's RNG as it is.
"""

from __future__ import annotations

import base64
import random
import struct
import sys
from typing import Any

import numpy as np
import torch

MT_WORDS = 624  # MT19937's state words (``random``'s and numpy's)
_VERSION = b"SRNG1"
_MT = struct.Struct(f"<{MT_WORDS}I")
_INT = struct.Struct("<i")
_GAUSS = struct.Struct("<?d")  # has a cached Gaussian, its value
_LEN = struct.Struct("<I")
RAW = "raw"  # the wire form's tags
CANON = "canon"


# -- to the canonical form -----------------------------------------------------------------


_ABSENT_POS = -1
_NUMPY_ABSENT = _MT.pack(*[0] * MT_WORDS) + _INT.pack(_ABSENT_POS) + _GAUSS.pack(False, 0.0)
_NUMPY_AT = len(_VERSION) + _INT.size + _MT.size + _GAUSS.size  # numpy's part, canonical form
_NUMPY_END = _NUMPY_AT + len(_NUMPY_ABSENT)


def _numpy_part(nps: Any) -> bytes:
    """numpy's part of the canonical form, from ``np.random.get_state(legacy=True)`` or None."""
    if nps is None:
        return _NUMPY_ABSENT
    _, key, pos, has_gauss, cached = nps
    return b"".join((_MT.pack(*[int(k) for k in key]), _INT.pack(int(pos)),
                     _GAUSS.pack(bool(has_gauss), float(cached) if has_gauss else 0.0)))


def _pack(random_words: Any, random_index: int, random_gauss: float | None,
          numpy_part: bytes, torch_bytes: bytes) -> bytes:
    return b"".join((
        _VERSION,
        _INT.pack(random_index), _MT.pack(*random_words),
        _GAUSS.pack(random_gauss is not None, random_gauss or 0.0),
        numpy_part,
        _LEN.pack(len(torch_bytes)), torch_bytes,
    ))


def canonical_public(py: Any, nps: Any, torch_bytes: bytes) -> bytes:
    """The canonical form of ``random.getstate()``, ``np.random.get_state(legacy=True)`` (None:
    absent) and torch's state as bytes."""
    _, internal, gauss_next = py
    return _pack(internal[:MT_WORDS], internal[MT_WORDS], gauss_next, _numpy_part(nps),
                 torch_bytes)


def numpy_absent(state: Any) -> bool:
    """Whether a wire, canonical or encoded state's numpy part is absent."""
    if isinstance(state, tuple):
        if state[0] == RAW:
            return state[3] is None
        state = state[1]
    elif isinstance(state, str):
        state = decode(state)
    return bool(_INT.unpack_from(state, _NUMPY_AT + _MT.size)[0] == _ABSENT_POS)


def _with_numpy(canonical: bytes, nps: Any) -> bytes:
    """``canonical`` with numpy's part replaced by ``np.random.get_state(legacy=True)``."""
    return canonical[:_NUMPY_AT] + _numpy_part(nps) + canonical[_NUMPY_END:]


def _canonical_raw(wire: tuple) -> bytes:
    """The raw copies are in this machine's layout (``int index; uint32 words[624]`` for
    ``random``, ``uint32 key[624]; int pos`` and ``int has_gauss; double gauss`` for numpy)."""
    _, random_raw, gauss_next, numpy_raw, numpy_gauss, torch_bytes = wire
    if numpy_raw is None:  # absent
        index, *words = struct.unpack(f"=i{MT_WORDS}I", random_raw)
        return _pack(words, index, gauss_next, _NUMPY_ABSENT, torch_bytes)
    if sys.byteorder == "little":  # the raw layouts are the canonical ones: no unpacking
        has_gauss = struct.unpack_from("<i", numpy_gauss, 0)[0]
        return b"".join((
            _VERSION, random_raw, _GAUSS.pack(gauss_next is not None, gauss_next or 0.0),
            numpy_raw, _GAUSS.pack(bool(has_gauss), struct.unpack_from("<d", numpy_gauss, 8)[0]
                                   if has_gauss else 0.0),
            _LEN.pack(len(torch_bytes)), torch_bytes,
        ))
    order = ">"
    index, *words = struct.unpack(f"{order}i{MT_WORDS}I", random_raw)
    *key, pos = struct.unpack(f"{order}{MT_WORDS}Ii", numpy_raw)
    has_gauss = struct.unpack_from(f"{order}i", numpy_gauss, 0)[0]
    cached = struct.unpack_from(f"{order}d", numpy_gauss, 8)[0]
    return _pack(words, index, gauss_next,
                 _numpy_part(("MT19937", key, pos, has_gauss, cached)), torch_bytes)


def encode(state: Any, numpy_at_load: Any = None) -> str:
    """The encoded form of a wire or encoded state; an absent numpy part is given
    ``numpy_at_load`` (``np.random.get_state(legacy=True)`` once loaded) where there is one."""
    if isinstance(state, str):
        if numpy_at_load is None:
            return state
        canonical = decode(state)
    else:
        canonical = state[1] if state[0] == CANON else _canonical_raw(state)
    if numpy_at_load is not None and numpy_absent(canonical):
        canonical = _with_numpy(canonical, numpy_at_load)
    return base64.b64encode(canonical).decode("ascii")


# -- back into the global RNGs -------------------------------------------------------------


def decode(text: str) -> bytes:
    """The canonical form of an encoded state; ``ValueError`` naming what is wrong."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError(f"not base64 ({exc})") from None
    fixed = len(_VERSION) + 2 * (_INT.size + _MT.size + _GAUSS.size) + _LEN.size
    if not raw.startswith(_VERSION) or len(raw) < fixed:
        raise ValueError("not one stoker.DataLoader.state_dict() wrote")
    return raw


def check_saved(text: Any, field: str, what: str) -> None:
    """Refuse (at ``load_state_dict``) a saved RNG state that ``state_dict()`` did not write:
    ``ValueError`` naming ``field`` (``state['...']``) and ``what`` it should hold."""
    try:
        if not isinstance(text, str):
            raise ValueError(f"a {type(text).__name__}, not a str")
        decode(text)
    except ValueError as exc:
        raise ValueError(
            f"load_state_dict: {field} is not {what} ({exc}). Pass the dict returned by "
            "DataLoader.state_dict() unchanged."
        ) from None


def restore(canonical: bytes) -> None:
    """Set ``random``, numpy's global RNG and torch's default generator to a canonical state."""
    at = len(_VERSION)
    (index,) = _INT.unpack_from(canonical, at)
    at += _INT.size
    words = _MT.unpack_from(canonical, at)
    at += _MT.size
    has, gauss = _GAUSS.unpack_from(canonical, at)
    at += _GAUSS.size
    random.setstate((3, (*words, index), gauss if has else None))
    if not numpy_absent(canonical):
        key = np.array(_MT.unpack_from(canonical, at), dtype=np.uint32)
        (pos,) = _INT.unpack_from(canonical, at + _MT.size)
        has, gauss = _GAUSS.unpack_from(canonical, at + _MT.size + _INT.size)
        np.random.set_state(("MT19937", key, pos, int(has), gauss if has else 0.0))
    at = _NUMPY_END
    (size,) = _LEN.unpack_from(canonical, at)
    at += _LEN.size
    state = torch.frombuffer(bytearray(canonical[at:at + size]), dtype=torch.uint8)
    torch.set_rng_state(state.clone())
