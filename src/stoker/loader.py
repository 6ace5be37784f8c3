"""``stoker.DataLoader``: torch's DataLoader interface on stoker's engine.

It *is* a ``torch.utils.data.DataLoader`` (a subclass): the constructor, its validation and
error messages, ``len()``, frozen attributes and the generic alias are torch's own, so code that
checks ``isinstance(loader, torch.utils.data.DataLoader)`` (Lightning, Accelerate) keeps working.
Iteration is stoker's: see ``_runtime``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch.utils.data

from stoker._runtime.base_iter import BaseIterator
from stoker._runtime.inline_iter import InlineIterator
from stoker._runtime.process_iter import ProcessIterator

T_co = TypeVar("T_co", covariant=True)


class DataLoader(torch.utils.data.DataLoader[T_co]):
    """Drop-in replacement for :class:`torch.utils.data.DataLoader`; same arguments, same batches.

    Worker processes start with ``fork`` where available unless ``multiprocessing_context``
    says otherwise; batches come back through reused shared memory instead of pickles.
    """

    def __iter__(self) -> BaseIterator:  # type: ignore[override]
        if self.persistent_workers and self.num_workers > 0:
            it = self._iterator
            if it is None or it.stopped:  # type: ignore[attr-defined]
                self._iterator = self._get_iterator()
            else:
                it._reset(self)
            return self._iterator  # type: ignore[return-value]
        return self._get_iterator()

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return InlineIterator(self)
        self.check_worker_number_rationality()
        return ProcessIterator(self)
