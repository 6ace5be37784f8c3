"""What every loader iterator shares: sampler iterator, base seed, torch's length warning."""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data import IterableDataset

from stoker._core.specs import FetchSpec
from stoker.collate import default_collate, default_convert
from stoker.device.pin import pin_target
from stoker.sampling.seeds import draw_base_seed


def resolve_collate(collate_fn: Any) -> Any:
    """Swap torch's default collate/convert for ours (same results, writes into shared memory)."""
    from torch.utils.data import _utils

    if collate_fn is _utils.collate.default_collate:
        return default_collate
    if collate_fn is _utils.collate.default_convert:
        return default_convert
    return collate_fn


def fetch_spec_of(loader: Any) -> FetchSpec:
    return FetchSpec(
        dataset=loader.dataset,
        kind="iterable" if isinstance(loader.dataset, IterableDataset) else "map",
        auto_collation=loader._auto_collation,
        collate_fn=resolve_collate(loader.collate_fn),
        drop_last=loader.drop_last,
    )


class BaseIterator:
    def __init__(self, loader: Any) -> None:
        self._dataset = loader.dataset
        self._fetch_spec = fetch_spec_of(loader)
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._len_reported = loader._IterableDataset_len_called
        self._pin = pin_target(loader.pin_memory, loader.pin_memory_device) is not None
        # Same order as torch: iter(sampler) first, then the base seed, so a shared generator
        # yields the same shuffles and seeds.
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = draw_base_seed(loader.generator)
        self._num_yielded = 0

    def __iter__(self) -> BaseIterator:
        return self

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")

    def _reset(self, loader: Any) -> None:
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._len_reported = loader._IterableDataset_len_called

    def _next_data(self) -> Any:
        raise NotImplementedError

    def __next__(self) -> Any:
        data = self._next_data()
        self._num_yielded += 1
        if (
            self._fetch_spec.kind == "iterable"
            and self._len_reported is not None
            and self._num_yielded > self._len_reported
        ):
            self._warn_length()
        return data

    def _warn_length(self) -> None:
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be {self._len_reported}"
            f"(when accessing len(dataloader)), but {self._num_yielded} samples have been fetched. "
        )
        if self._num_workers > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                "for examples."
            )
        warnings.warn(message, stacklevel=3)
