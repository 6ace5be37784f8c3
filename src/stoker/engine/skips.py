"""The ``on_error="skip"`` ledger: log the first skipped sample, count all, enforce the budget."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

from stoker.errors import SkipBudgetExceeded
from stoker.fetch.fetchers import Skipped

logger = logging.getLogger("stoker")
_SHOWN = 5


def skip_limit(budget: int | float, epoch_samples: int | None) -> int:
    """An int budget is a count per epoch; a float in (0, 1) a fraction of the epoch's samples."""
    if isinstance(budget, float) and budget < 1:
        return math.floor(budget * epoch_samples) if epoch_samples else 0
    return int(budget)


class SkipLedger:
    def __init__(
        self, budget: int | float, epoch_samples: Callable[[], int | None], logged: set[Any],
        stats: Any,
    ) -> None:
        self._stats = stats
        self.budget = budget
        # Asked only when a sample is skipped under a fractional budget: torch never calls
        # len(sampler) for it, and a dataset that logs its __len__ calls sees torch's calls.
        self._epoch_samples = epoch_samples
        self._limit: int | None = None
        self.skipped: list[Skipped] = []
        self._logged = logged  # the loader's: a sample bad every epoch is logged once
        self._told_empty = False

    def empty_step(self, position: int, index_sampler: Any) -> None:
        """Every sample of the step at ``position`` was skipped: it is not yielded, so the
        epoch is shorter than ``len(loader)``; said once per epoch, counted in the stats."""
        self._stats.empty_batches += 1
        if self._told_empty:
            return
        self._told_empty = True
        try:
            total = f" = {len(index_sampler)}"
        except TypeError:
            total = ""
        warnings.warn(
            f"on_error='skip' skipped every sample of batch {position}, so it is not yielded: "
            f"this epoch has fewer batches than len(loader){total}. loader.stats().empty_batches "
            "counts such batches; a training loop that relies on len(loader) steps per epoch "
            "(a learning-rate schedule, DDP) should not rely on it with on_error='skip'.",
            RuntimeWarning, stacklevel=4,
        )

    @property
    def limit(self) -> int:
        if self._limit is None:
            fractional = isinstance(self.budget, float) and self.budget < 1
            self._limit = skip_limit(self.budget, self._epoch_samples() if fractional else None)
        return self._limit

    def record(self, skipped: list[Skipped]) -> None:
        for s in skipped:
            key = repr(s.index)
            if key in self._logged:
                continue
            # One WARNING per loader, the first skip; each other bad sample once, at DEBUG.
            first = not self._logged
            self._logged.add(key)
            if first:
                logger.warning(
                    "stoker skipped sample %s: %s. Further skipped samples are counted in "
                    "loader.stats().skipped and logged at DEBUG level (logger 'stoker').",
                    key, s.error)
            else:
                logger.debug("stoker skipped sample %s: %s", key, s.error)
        self.skipped.extend(skipped)
        self._stats.skipped += len(skipped)
        if self.skipped and len(self.skipped) > self.limit:
            shown = "; ".join(f"{s.index!r}: {s.error}" for s in self.skipped[:_SHOWN])
            more = f" (and {len(self.skipped) - _SHOWN} more)" if len(self.skipped) > _SHOWN else ""
            raise SkipBudgetExceeded(
                f"on_error='skip' skipped {len(self.skipped)} samples this epoch, more than the "
                f"budget of {self.limit} (skip_budget={self.budget!r}). First errors: "
                f"{shown}{more}. Fix those samples, or raise skip_budget."
            )
