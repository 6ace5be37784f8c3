"""NOTE [ Raw RNG snapshots ]: byte-copies of the global RNG states are exact, see every draw,
and fall back to the public API where the layout was not found."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from stoker.sampling import global_rngs
from stoker.sampling.seeds import global_seeds, reseeded_since, seed_worker_rngs


def _draws() -> tuple:
    return (
        random.random(), random.gauss(0, 1), random.getrandbits(70),
        np.random.rand(3).tolist(), np.random.randn(3).tolist(), int(np.random.randint(1 << 30)),
        torch.rand(3).tolist(), torch.randn(2).tolist(),
    )


@pytest.fixture(params=["raw", "public"])
def path(request, monkeypatch):
    """Each test runs on the raw copies and on the public-API fallback."""
    if request.param == "public":
        monkeypatch.setattr(global_rngs, "_RANDOM_OFFSET", None)
        monkeypatch.setattr(global_rngs, "_NUMPY_GAUSS_OFFSET", None)
    saved = global_rngs.snapshot()
    yield request.param
    global_rngs.restore(saved)


def test_raw_copies_are_used_on_this_python_and_numpy():
    # Without them every num_workers=0 batch pays ~300 us; a layout change must be seen here.
    assert global_rngs.raw_paths() == {"random": True, "numpy": True}


def test_restore_replays_the_same_draws_with_gaussian_caches_set(path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves random's gauss_next set
    np.random.standard_normal()  # leaves numpy's legacy cached Gaussian set
    state = global_rngs.snapshot()
    first = [_draws() for _ in range(300)]  # numpy and random regenerate their 624 words
    global_rngs.restore(state)
    assert [_draws() for _ in range(300)] == first


@pytest.mark.parametrize(
    "draw",
    [
        random.random,
        lambda: random.gauss(0, 1),
        np.random.rand,
        lambda: np.random.randint(10),
        np.random.randn,  # legacy Gaussian: every other call is served from a cache
        lambda: torch.rand(1),
    ],
    ids=["random", "random-gauss", "numpy", "numpy-int", "numpy-gauss", "torch"],
)
def test_every_draw_is_seen(path, draw):
    seen = []
    for _ in range(4):
        before = global_rngs.snapshot()
        draw()
        seen.append(global_rngs.changed_since(before))
    assert all(seen)  # a Gaussian served from a cache too: the cache is part of the state
    before = global_rngs.snapshot()
    assert not global_rngs.changed_since(before)


def test_a_snapshot_survives_reseeding_and_restores_the_callers_stream(path):
    state = global_rngs.snapshot()
    expected = _draws()
    global_rngs.restore(state)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    _draws()
    assert global_rngs.changed_since(state)
    global_rngs.restore(state)
    assert _draws() == expected


def test_a_replaced_random_function_falls_back_to_the_public_api(monkeypatch):
    random.seed(5)
    random.gauss(0, 1)
    state = global_rngs.snapshot()
    expected = random.getstate()
    random.seed(6)
    monkeypatch.setattr(random, "random", lambda: 0.5)  # e.g. a test double
    global_rngs.restore(state)  # a raw snapshot put back through random.setstate
    assert random.getstate() == expected
    assert global_rngs.snapshot()[0] == expected  # and snapshots are public ones meanwhile


# -- reseeded_since: was a global RNG seeded (not merely drawn from)? ----------------------------


@pytest.mark.parametrize("act,reseeded", [
    (lambda: None, False),
    (lambda: random.random(), False),
    (lambda: np.random.rand(700), False),  # past a regeneration of numpy's 624 words
    (lambda: torch.rand(3), False),
    (lambda: random.seed(7), True),
    (lambda: np.random.seed(7), True),
    (lambda: torch.manual_seed(7), True),
    (lambda: (torch.manual_seed(7), torch.rand(2)), True),
])
def test_reseeded_since_tells_seeding_from_drawing(act, reseeded):
    saved = global_rngs.snapshot()
    try:
        seed_worker_rngs(1234, 0)  # as a worker starts
        before = global_seeds()
        act()
        assert reseeded_since(before) is reseeded
    finally:
        global_rngs.restore(saved)
