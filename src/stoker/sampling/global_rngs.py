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

NOTE [ numpy's RNG loads when the program loads it ]
torch's DataLoader never loads ``numpy.random`` in the main process (its workers do, to seed
it), and a program that never draws from numpy finds it not loaded after a pass. So a snapshot
here does not load it either: taken before the program loaded it, numpy's part is *absent*
(``None``), and the import is watched (``_core/import_watch.py``): the state numpy's RNG has
the moment its module body has run (seeded from the OS, nothing drawn yet) is kept. An absent
part stands for that state: restoring it puts that state back (nothing while numpy is still
not loaded), and ``encoded`` states carry it, so an order a sampler drew from numpy after the
epoch started is drawn again on resume as it was.

A worker's replies carry these states in their *wire* form (``take``; the forms are described
in ``sampling.worker_rngs``), taken here, beside the copies, so that a batch's path through a
worker does not pass through the forms' module as well (issue 35's ``batch_path.py``).
"""

from __future__ import annotations

import ctypes
import functools
import random
import struct
import sys
from typing import Any

import numpy as np
import torch

from stoker._core.fast_paths_env import env_allows
from stoker._core.import_watch import when_imported
from stoker._core.torch_modes import unseen
from stoker._core.torch_own import c_method
from stoker.sampling import worker_rngs
from stoker.sampling.worker_rngs import CANON, MT_WORDS, RAW, canonical_public

_MT_WORDS = MT_WORDS
# Module globals, so a test can take the public path: None there. Found at the first snapshot.
_ASK: Any = "found at first use"
_RANDOM_OFFSET: Any = _ASK
_NUMPY_GAUSS_OFFSET: Any = _ASK


def _random_offset() -> int | None:
    global _RANDOM_OFFSET
    if _RANDOM_OFFSET is _ASK:
        _RANDOM_OFFSET = random_offset()
    return _RANDOM_OFFSET  # type: ignore[no-any-return]


def _numpy_gauss_offset() -> int | None:
    global _NUMPY_GAUSS_OFFSET
    if _NUMPY_GAUSS_OFFSET is _ASK:
        _NUMPY_GAUSS_OFFSET = numpy_gauss_offset()
    return _NUMPY_GAUSS_OFFSET  # type: ignore[no-any-return]


# -- where the raw states lie (calibrated once) ------------------------------------------------
# Found on private instances the first time a snapshot asks, and checked by round trips; not at
# import, where numpy's RNG module is not loaded yet (NOTE [ Import only what the loader
# needs ]). A fast path that relies on CPython's and numpy's object layouts, under NOTE [ One
# switch for the fast paths ] (``stoker.fastpaths.switch``) but kept here, beside the snapshots
# that use it: with ``STOKER_FAST_PATHS=0`` nothing is calibrated and every state goes through
# the public APIs.

_MT19937_STATE_BYTES = _MT_WORDS * 4 + 4  # uint32 key[624]; int pos


def _memory(obj: object, nbytes: int) -> bytes:
    return ctypes.string_at(id(obj), nbytes)


def _find(obj: object, nbytes: int, needle: bytes) -> int | None:
    """The one offset of ``needle`` in the first ``nbytes`` of ``obj``'s memory, else None."""
    haystack = _memory(obj, nbytes)
    at = haystack.find(needle)
    return at if at >= 0 and haystack.find(needle, at + 1) < 0 else None


# -- random ------------------------------------------------------------------------------------


def _find_random_offset() -> int | None:
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


def _find_numpy_gauss_offset() -> int | None:
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
    return _calibrated(_find_random_offset) if env_allows() else None


@functools.cache
def numpy_gauss_offset() -> int | None:
    """Where numpy's Gaussian cache lies in a ``RandomState``, found once; None: public API."""
    return _calibrated(_find_numpy_gauss_offset) if env_allows() else None


def calibrate() -> None:
    """Find both offsets now (~6 ms): the process about to fork workers does it once, so that
    each worker inherits them instead of finding them again at its first batch; numpy's only
    where ``numpy.random`` is loaded (NOTE [ numpy's RNG loads when the program loads it ])."""
    random_offset()
    if "numpy.random" in sys.modules:
        numpy_gauss_offset()


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


_NUMPY_AT_LOAD: Any = None  # ``get_state(legacy=True)`` when numpy.random loaded, if watched


def keep_numpy_state_at_load(module: Any) -> None:
    """The import watch's hook (NOTE [ numpy's RNG loads when the program loads it ]): never
    raises, as the program's import would."""
    global _NUMPY_AT_LOAD
    try:
        _NUMPY_AT_LOAD = module.get_state(legacy=True)
    except Exception:  # another numpy: absent parts stay absent
        _NUMPY_AT_LOAD = None


def numpy_at_load() -> Any:
    """numpy's state when the program loaded ``numpy.random``, once an absent part watched it;
    else None."""
    return _NUMPY_AT_LOAD


def _numpy_loaded() -> bool:
    """Whether ``numpy.random`` is loaded; else the import is watched (``np.random`` would
    load it: numpy loads its submodules at first use)."""
    if "numpy.random" in sys.modules:
        return True
    when_imported("numpy.random", "stoker.sampling.global_rngs:keep_numpy_state_at_load")
    return False


def load_numpy() -> None:
    """Load ``numpy.random`` (an absent part's watch keeps the state it loads with)."""
    import numpy.random  # noqa: F401


def watch_absent_numpy(state: Any) -> bool:
    """Whether ``state``'s numpy part is absent, numpy.random still not loaded: its import
    is then watched, the state it loads with to fill the part."""
    return worker_rngs.numpy_absent(state) and not _numpy_loaded()


def _numpy_state(raw: bool = True) -> Any:
    if not _numpy_loaded():
        return None  # absent
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
    if state is None:  # absent: numpy's RNG as it was loaded, if it is by now
        if _NUMPY_AT_LOAD is not None and "numpy.random" in sys.modules:
            np.random.set_state(_NUMPY_AT_LOAD)
        return
    rs = _numpy_global()
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], bytes):
        offset = _numpy_gauss_offset()
        assert offset is not None
        numpy_restore(rs, offset, state)
    else:
        rs.set_state(state)


_numpy = c_method("numpy")  # torch's, whatever a program patched (NOTE [ torch's own functions ])


def snapshot(raw: bool = True) -> tuple[Any, Any, torch.Tensor]:
    """The states of ``random``, numpy's global RNG and torch's default CPU generator;
    ``raw=False``: through the public APIs only (NOTE [ One switch for the fast paths ])."""
    return _random_state(raw), _numpy_state(raw), torch.get_rng_state()


def take() -> tuple:
    """The wire form of the states now (``sampling.worker_rngs``): the raw copies and torch's
    state as bytes, else (no raw copies here) the canonical form."""
    py, nps, ts = snapshot()
    with unseen():  # NOTE [ The program's torch modes see torch's calls ]
        torch_bytes = _numpy(ts).tobytes()
    if isinstance(py[0], bytes) and (nps is None or isinstance(nps[0], bytes)):
        return (RAW, py[0], py[1], *(nps or (None, None)), torch_bytes)
    return (CANON, canonical_public(random.getstate(), None if nps is None
                                    else np.random.get_state(legacy=True), torch_bytes))


class Changes:
    """The wire form, given only when it differs from the last one given: a worker's replies
    carry its states only when they changed (NOTE [ Worker streams resume ]); the main
    process reads every reply in order, so it knows them."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple | None = None

    def take(self) -> tuple | None:
        now = take()
        if now == self._last:
            return None
        self._last = now
        return now


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
        or not _numpy_same(nps)
        or not torch.equal(torch.get_rng_state(), ts)
    )


def _numpy_same(nps: Any) -> bool:
    now = _numpy_state()
    if nps is None and now is not None:  # loaded since: drew, unless still as it was loaded
        return _NUMPY_AT_LOAD is not None and _same(
            tuple(np.random.get_state(legacy=True)), tuple(_NUMPY_AT_LOAD))
    return _same(now, nps)


def raw_paths() -> dict[str, bool]:
    """Which RNGs are copied as raw bytes here (the rest use the public API)."""
    return {"random": _random_offset() is not None, "numpy": _numpy_gauss_offset() is not None}
