"""num_workers=0: fetch and collate in the calling thread, like torch."""

from __future__ import annotations

from typing import Any

from stoker._runtime.base_iter import BaseIterator
from stoker.device.pin import pin_batch
from stoker.executors.fetch import EMPTY, make_fetcher
from stoker.executors.remote_errors import add_note, describe_indices
from stoker.sampling.seeds import GlobalRngGuard, batch_seed, seed_global_rngs


class InlineIterator(BaseIterator):
    def __init__(self, loader: Any, resume: dict[str, Any] | None = None) -> None:
        if loader.timeout != 0:
            raise AssertionError(
                f"timeout={loader.timeout} needs worker processes: with num_workers=0 batches "
                "are loaded in the calling thread and cannot time out. Set timeout=0, or "
                "num_workers>0."
            )
        super().__init__(loader, resume)
        self._fetcher = make_fetcher(self._fetch_spec)

    def _fetch(self, position: int, index: Any) -> Any:
        if self._seeding != "per_batch":
            return self._fetcher.fetch(index)
        # The caller's own RNG streams (dropout, their augmentations) are left as they were.
        with GlobalRngGuard():
            seed_global_rngs(batch_seed(self._base_seed, self._epoch, position))
            return self._fetcher.fetch(index)

    def _next_data(self) -> Any:
        while True:
            position, index = self._next_index()
            try:
                data = self._fetch(position, index)
            except StopIteration:
                raise
            except Exception as exc:
                add_note(exc, f"stoker: raised in the main process (num_workers=0) while loading "
                              f"{describe_indices(index)}.")
                raise
            if self._fetcher.skipped:
                self._skips.record(self._fetcher.skipped)
            if self._dropped(position):
                continue
            self._delivered(position)
            if data is EMPTY:
                continue
            return pin_batch(data) if self._pin else data
