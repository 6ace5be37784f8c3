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
