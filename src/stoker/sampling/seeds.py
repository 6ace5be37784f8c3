"""Seeds, drawn and derived exactly the way torch's DataLoader does.

torch draws one 64-bit ``base_seed`` per iterator from the loader's ``generator`` (or the
global RNG), then seeds worker ``w`` with ``base_seed + w`` for ``random`` and torch, and with a
SeedSequence-style hash of (base_seed, w) for numpy's legacy global RNG, so that ``random``
and numpy do not produce correlated streams. Matching it bit for bit keeps augmentations
identical when users switch loaders.
"""

from __future__ import annotations

import hashlib
import random
import struct

import numpy as np
import torch

from stoker.sampling import global_rngs

_MASK32 = 0xFFFFFFFF


def draw_base_seed(generator: torch.Generator | None) -> int:
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def numpy_seed_words(base_seed: int, worker_id: int) -> list[int]:
    """Four 32-bit words for ``np.random.seed``: numpy's SeedSequence mixing, pool size 4."""
    entropy = [worker_id, base_seed & _MASK32, base_seed >> 32, 0]
    hash_mult = 0x43B0D7E5

    def hashmix(value: int) -> int:
        nonlocal hash_mult
        value = (value ^ hash_mult) & _MASK32
        hash_mult = (hash_mult * 0x931E8875) & _MASK32
        value = (value * hash_mult) & _MASK32
        return (value ^ (value >> 16)) & _MASK32

    def mix(x: int, y: int) -> int:
        result = (0xCA01F9DD * x - 0x4973F715 * y) & _MASK32
        return (result ^ (result >> 16)) & _MASK32

    pool = [hashmix(word) for word in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))

    out_mult = 0x8B51F9DD
    words = []
    for value in pool:
        value = (value ^ out_mult) & _MASK32
        out_mult = (out_mult * 0x58F38DED) & _MASK32
        value = (value * out_mult) & _MASK32
        words.append((value ^ (value >> 16)) & _MASK32)
    return words


def seed_worker_rngs(base_seed: int, worker_id: int) -> int:
    """Seed ``random``, torch and numpy's global RNGs for a worker; returns its seed."""
    seed = base_seed + worker_id
    random.seed(seed)
    # The CPU generator is what torch.manual_seed seeds here too; skipping its lazy
    # accelerator seeding saves ~10 ms of traceback formatting per worker start.
    torch.default_generator.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency, but stay torch-like
        return seed
    np.random.seed(numpy_seed_words(base_seed, worker_id))
    return seed


_MASK64 = (1 << 64) - 1
_blake2b = hashlib.blake2b
_PACKERS = {n: struct.Struct(f"<{n}Q") for n in range(1, 5)}


def mix_seed(*words: int) -> int:
    """A 64-bit hash of a few integers (BLAKE2b: fast in C, stable across processes): of
    each word's low 64 bits, little-endian. Runs several times per batch, so it packs with a
    prebuilt ``struct.Struct``."""
    packer = _PACKERS.get(len(words)) or struct.Struct(f"<{len(words)}Q")
    data = packer.pack(*map(_MASK64.__and__, words))
    return int.from_bytes(_blake2b(data, digest_size=8).digest(), "little")


def batch_seed(base_seed: int, epoch: int, batch_index: int) -> int:
    """A 64-bit seed for one batch, the same whichever worker (or thread) runs it."""
    return mix_seed(base_seed, epoch, batch_index)


def stream_batch_seed(base_seed: int, epoch: int, worker_id: int, ordinal: int) -> int:
    """An IterableDataset's batch in workers: the ``ordinal``-th batch of worker
    ``worker_id``'s stream. Its task position would depend on when the main process read an
    ended worker's reply; which batch of its own stream it is does not."""
    return mix_seed(base_seed, epoch, worker_id, ordinal)


def seed_global_rngs(seed: int) -> None:
    """Seed ``random``, numpy's global RNG and torch's default generator from one seed.

    Each gets its own derived seed, so the three streams are not correlated.
    """
    random.seed(mix_seed(seed, 1))
    # Not torch.manual_seed: it also queues lazy accelerator seeding, recording a traceback
    # each call (0.5-4 ms per batch); the CPU generator is what __getitem__ draws from.
    torch.default_generator.manual_seed(mix_seed(seed, 2) >> 1)
    np.random.seed(mix_seed(seed, 3) & 0xFFFFFFFF)


_FRESH_MT_POSITION = 624  # where a just-seeded Mersenne Twister (random, numpy) stands


def global_seeds() -> tuple[int, tuple, tuple]:
    """What ``reseeded_since`` compares: torch's initial seed, ``random``'s and numpy's states."""
    import numpy as np

    return torch.initial_seed(), random.getstate(), tuple(np.random.get_state(legacy=True))


def reseeded_since(before: tuple[int, tuple, tuple]) -> bool:
    """Was ``random``, numpy's global RNG or torch's default generator seeded since ``before``
    (drawing from them is not seeding)? A freshly seeded Mersenne Twister stands at position
    624 until its first draw; torch says its seed."""
    import numpy as np

    torch_seed, random_state, numpy_state = before
    if torch.initial_seed() != torch_seed:
        return True
    now = random.getstate()
    if now != random_state and now[1][-1] == _FRESH_MT_POSITION:
        return True
    _, keys, position, *_ = np.random.get_state(legacy=True)
    return position == _FRESH_MT_POSITION and not (
        position == numpy_state[2] and np.array_equal(keys, numpy_state[1])
    )


class GlobalRngGuard:
    """Saves and restores the global RNGs around a fetch in the caller's own process
    (NOTE [ Raw RNG snapshots ]: a few microseconds each way; ``raw=False``: the public APIs,
    NOTE [ One switch for the fast paths ])."""

    def __init__(self, raw: bool = True) -> None:
        self._raw = raw

    def __enter__(self) -> None:
        self._states = global_rngs.snapshot(self._raw)

    def __exit__(self, *exc: object) -> None:
        global_rngs.restore(self._states)
