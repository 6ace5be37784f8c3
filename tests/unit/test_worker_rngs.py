"""A worker's global RNG states in a state dict (``stoker.sampling.worker_rngs``): encoded,
restored, and the same whether they were copied raw or through the public APIs."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from stoker.sampling import global_rngs, worker_rngs


@pytest.fixture(autouse=True)
def _leave_the_global_rngs_as_they_were() -> Iterator[None]:
    saved = global_rngs.snapshot(raw=False)
    yield
    global_rngs.restore(saved)


def _draws() -> tuple:
    return (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(),
            np.random.rand(), torch.rand(3).tolist())


@pytest.mark.parametrize("gauss_cached", [False, True])
def test_encoded_states_restore_the_same_draws(gauss_cached: bool) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    if gauss_cached:  # both random and numpy keep the second value of a Gaussian pair
        random.gauss(0, 1)
        np.random.standard_normal()
    text = worker_rngs.encode(global_rngs.take())
    expected = _draws()
    assert json.loads(json.dumps(text)) == text
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    worker_rngs.restore(worker_rngs.decode(text))
    assert _draws() == expected


def test_raw_and_public_copies_encode_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    random.seed(4)
    np.random.seed(5)
    np.random.standard_normal()
    raw = global_rngs.take()
    monkeypatch.setattr(global_rngs, "_RANDOM_OFFSET", None)  # the public path
    monkeypatch.setattr(global_rngs, "_NUMPY_GAUSS_OFFSET", None)
    public = global_rngs.take()
    assert public[0] == "canon"
    assert worker_rngs.encode(public) == worker_rngs.encode(raw)


def test_unchanged_states_compare_equal() -> None:
    first = global_rngs.take()
    assert global_rngs.take() == first
    random.random()
    assert global_rngs.take() != first


def test_something_else_is_refused() -> None:
    with pytest.raises(ValueError, match="not base64"):
        worker_rngs.decode("not base64!")
    with pytest.raises(ValueError, match="not one stoker.DataLoader.state_dict"):
        worker_rngs.decode("aGVsbG8=")


@pytest.mark.parametrize("path", ["raw", "public"])
def test_an_absent_numpy_part_leaves_numpy_alone_until_filled(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state taken before the program loaded numpy.random (NOTE [ numpy's RNG loads when
    the program loads it ]): restoring it leaves numpy's RNG as it is; filled with the state
    numpy loaded with, it restores that one."""
    if path == "public":
        monkeypatch.setattr(global_rngs, "_RANDOM_OFFSET", None)
    random.seed(6)
    torch.manual_seed(7)
    with monkeypatch.context() as unloaded:
        unloaded.setattr(global_rngs, "_numpy_loaded", lambda: False)
        absent = global_rngs.take()
    assert worker_rngs.numpy_absent(absent)
    expected_random, expected_torch = random.random(), torch.rand(3).tolist()
    np.random.seed(8)
    at_load = np.random.get_state(legacy=True)
    expected_numpy = np.random.rand(3).tolist()

    np.random.seed(8)
    worker_rngs.restore(worker_rngs.decode(worker_rngs.encode(absent)))
    assert (random.random(), torch.rand(3).tolist()) == (expected_random, expected_torch)
    assert np.random.rand(3).tolist() == expected_numpy  # numpy's own state, untouched

    filled = worker_rngs.encode(absent, at_load)
    assert not worker_rngs.numpy_absent(filled)
    np.random.seed(9)
    worker_rngs.restore(worker_rngs.decode(filled))
    assert random.random() == expected_random
    assert np.random.rand(3).tolist() == expected_numpy
    assert worker_rngs.encode(worker_rngs.encode(absent), at_load) == filled  # encoded, too
