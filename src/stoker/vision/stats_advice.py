"""``loader.stats()``'s line naming the ``stoker.vision`` import, with its gain measured on the
loader's own files (``vision/import_gain.py``).

Only for a loader whose verdict says the CPU work of ``__getitem__`` is what the loop waits for,
whose dataset is torchvision's folder pipeline (or ``stoker.vision``'s with fusion off). The
measure (about half a second, in the calling thread) runs once per dataset; later calls reuse
it. Nothing is logged or warned: the line is in ``stats().advice`` and the summary.
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Any

from stoker._core.stats import LoaderStats
from stoker.profile import verdict

_MODULES = ("torchvision.", "stoker.vision.")
_WORTH = 1.05  # a gain below this is noise, not advice
_measured: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _measure(dataset: Any) -> Any:
    from stoker.vision.import_gain import measure

    gain = _measured[dataset] = measure(dataset)
    return gain


def with_import_advice(stats: LoaderStats, dataset: Any) -> LoaderStats:
    """``stats`` of a loader over ``dataset`` with the import's line added to its advice and
    summary when it applies."""
    if not type(dataset).__module__.startswith(_MODULES):
        return stats
    if verdict.kind(stats) not in verdict.CPU_BOUND:
        return stats
    try:
        gain = _measured[dataset] if dataset in _measured else _measure(dataset)
    except TypeError:  # a dataset that cannot be a weak key: not one recognised here
        return stats
    if gain is None or gain.ratio < _WORTH:
        return stats
    text = gain.advice()
    return replace(stats, advice=(*stats.advice, text), summary=f"{stats.summary} Also: {text}.")
