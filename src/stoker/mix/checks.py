"""``stoker.Mix``'s argument checks: what was wrong, what was expected, what to change."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from torch.utils.data import Dataset, IterableDataset

Stop = Literal["first_exhausted", "all_exhausted", "cycle"]
_STOPS: tuple[Stop, ...] = ("first_exhausted", "all_exhausted", "cycle")


def is_sequence_of_sources(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and not isinstance(value, Dataset)


def check_sources(datasets: Any, weights: Any) -> tuple[list[Any], list[float]]:
    if not is_sequence_of_sources(datasets):
        raise TypeError(
            f"Mix takes a list of datasets as its first argument, got {short(datasets)}: "
            "pass them in a list, e.g. Mix([ds_a, ds_b], weights=[0.7, 0.3])"
        )
    if not datasets:
        raise ValueError(
            "Mix needs at least one dataset, got an empty list: pass the datasets to sample "
            "from, e.g. Mix([ds_a, ds_b], weights=[0.7, 0.3])"
        )
    for s, dataset in enumerate(datasets):
        if not isinstance(dataset, IterableDataset) and not (
            hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
        ):
            raise TypeError(
                f"Mix source {s} is a {type(dataset).__name__}: expected a map-style dataset "
                "(with __len__ and __getitem__) or a torch.utils.data.IterableDataset"
            )
    if weights is None:
        return list(datasets), [1.0] * len(datasets)
    weights = list(weights)
    if len(weights) != len(datasets):
        raise ValueError(
            f"Mix got {len(datasets)} datasets but {len(weights)} weights: give one weight per "
            "dataset, in the same order (or weights=None for equal weights)"
        )
    values = []
    for s, w in enumerate(weights):
        try:
            value = float(w)
        except (TypeError, ValueError):
            raise TypeError(f"Mix weights[{s}]={w!r} is not a number") from None
        if not np.isfinite(value) or value < 0:
            raise ValueError(
                f"Mix weights[{s}]={w!r}: weights must be finite and >= 0 (they are relative "
                "sampling rates); use 0 to leave a dataset out"
            )
        values.append(value)
    if sum(values) <= 0:
        raise ValueError(
            f"Mix weights sum to 0 ({values}): give at least one dataset a positive weight"
        )
    return list(datasets), values


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"Mix seed={seed!r}: expected an int >= 0 (it seeds numpy's SeedSequence)")
    return int(seed)


def check_stop(stop: Any) -> Stop:
    if stop not in _STOPS:
        raise ValueError(f"Mix stop={stop!r}: expected one of {_STOPS}")
    return stop  # type: ignore[no-any-return]


def check_num_samples(num_samples: Any, stop: Stop) -> int | None:
    if num_samples is None:
        return None
    if stop != "cycle":
        raise ValueError(
            f"Mix num_samples={num_samples!r} only applies to stop='cycle' (the other rules end "
            f"the mix by themselves); drop num_samples or use stop='cycle'"
        )
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
        raise ValueError(f"Mix num_samples={num_samples!r}: expected an int >= 0")
    return num_samples


def check_empty_sources(datasets: list[Any], weights: list[float], stop: Stop) -> None:
    consequence = {
        "first_exhausted": "the mix would end at its first draw",
        "all_exhausted": "the mix would wait for it forever",
        "cycle": "the mix would wait for it forever",
    }[stop]
    for s, (dataset, w) in enumerate(zip(datasets, weights, strict=True)):
        if w > 0 and not isinstance(dataset, IterableDataset) and len(dataset) == 0:
            raise ValueError(
                f"Mix source {s} ({type(dataset).__name__}) is empty but has weight {w:g}: it "
                f"can never yield a sample, and with stop={stop!r} {consequence}. Remove it, "
                "or give it weight 0"
            )


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
