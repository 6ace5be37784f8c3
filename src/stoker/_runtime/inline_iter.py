"""num_workers=0: fetch and collate in the calling thread, like torch."""

from __future__ import annotations

from typing import Any

from stoker._runtime.base_iter import BaseIterator
from stoker.device.pin import pin_batch
from stoker.executors.fetch import make_fetcher
from stoker.executors.remote_errors import add_note, describe_indices


class InlineIterator(BaseIterator):
    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        if self._timeout != 0:
            raise AssertionError(
                f"timeout={self._timeout} needs worker processes: with num_workers=0 batches are "
                "loaded in the calling thread and cannot time out. Set timeout=0, or "
                "num_workers>0."
            )
        self._fetcher = make_fetcher(self._fetch_spec)

    def _next_data(self) -> Any:
        index = next(self._sampler_iter)
        try:
            data = self._fetcher.fetch(index)
        except StopIteration:
            raise
        except Exception as exc:
            add_note(exc, f"stoker: raised in the main process (num_workers=0) while loading "
                          f"{describe_indices(index)}.")
            raise
        return pin_batch(data) if self._pin else data
