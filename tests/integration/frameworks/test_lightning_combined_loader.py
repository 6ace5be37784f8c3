"""Lightning's CombinedLoader, in this process, over torch's loader and the one under test:
it leaves torch's iterators out of its iterator's pickled state (a copy of the trainer taken
mid-epoch), and at the end of a fit it shuts a persistent multiprocessing iterator's workers
down. Both tell torch's iterators by class (NOTE [ torch's iterator classes ]); stoker's
iterators failed to pickle there."""

from __future__ import annotations

import gc
import pickle
from typing import Any

import pytest
from _launch import need


def _combined(cls: type, num_workers: int, persistent: bool) -> tuple[Any, list[Any]]:
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    loaders = [cls(list(range(n)), batch_size=2, num_workers=num_workers,
                   persistent_workers=persistent, timeout=60 if num_workers else 0)
               for n in (6, 4)]
    return CombinedLoader(loaders, mode="max_size_cycle"), loaders


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_combined_loaders_iterator_pickles_mid_epoch(Loader, TorchLoader, num_workers):
    need("lightning")

    def script(cls: type) -> list[Any]:
        combined, _ = _combined(cls, num_workers, persistent=False)
        first = next(iter(combined))
        copy = pickle.loads(pickle.dumps(combined._iterator))  # the loaders' iterators: None
        facts = [repr(first), copy.iterators, len(copy.iterables)]
        del combined, copy
        gc.collect()
        return facts

    assert script(Loader) == script(TorchLoader)


def test_a_combined_loaders_reset_stops_persistent_workers(Loader, TorchLoader):
    need("lightning")

    def script(cls: type) -> list[Any]:
        combined, loaders = _combined(cls, num_workers=2, persistent=True)
        first = next(iter(combined))
        workers = [list(loader._iterator._workers) for loader in loaders]
        combined.reset()  # as at the end of a fit
        facts = [repr(first), [[w.is_alive() for w in ws] for ws in workers],
                 [loader._iterator is None for loader in loaders]]
        del combined, loaders
        gc.collect()
        return facts

    assert script(Loader) == script(TorchLoader)
