"""The one switch for the fast paths that rely on interpreter or library internals.

NOTE [ One switch for the fast paths ]
stoker's default engine gives torch's results; some of its speed comes from code that relies on
how CPython, numpy or torch work inside, all of it in ``stoker.fastpaths`` (and the raw RNG
copies of NOTE [ Raw RNG snapshots ]):

* the batched ``__getitem__`` read from its source (NOTE [ Batched getitem from source ]): a
  batch computed as array gathers, ``__getitem__`` not called per sample;
* torch's ``TensorDataset``, ``StackDataset``, ``Subset`` and ``ConcatDataset`` over plain
  tensors, batched as gathers (NOTE [ torch's own datasets ]);
* ``dataset[index_tensor]`` for datasets that declare ``stoker_tensor_index = True`` (NOTE
  [ Vectorised fetch ]);
* loading plain-gather datasets in the calling thread (NOTE [ Gathers need no workers ]);
* torch's collate map pointed at stoker's slab-allocating collate in workers (NOTE [ torch's
  collate in stoker workers ]);
* forked workers reading the parent's large lists in place (NOTE [ Reading inherited lists in
  place ]) or from one shared copy (NOTE [ Automatic list sharing ]);
* ``random``'s and numpy's global RNG states copied as raw bytes (NOTE [ Raw RNG snapshots ]).

``DataLoader(fast_paths=False)``, or ``STOKER_FAST_PATHS=0`` in the environment (for a run you
cannot edit; it wins over the argument), turns all of them off: ``__getitem__`` is called per
sample, lists reach workers as torch's do, RNG states go through the public APIs. Use it when
debugging (a breakpoint or a counter in ``__getitem__``) or to rule stoker's cleverness out.
Whenever a dataset's ``__getitem__`` stops being called per sample, the ``stoker`` logger says
so once, at DEBUG (NOTE [ Advice is quiet ]), with the reason.
"""

from __future__ import annotations

import logging
from typing import Any

from stoker._core.fast_paths_env import ENV, env_allows
from stoker._core.torch_voice import ADVICE_LEVEL

__all__ = ["ENV", "enabled", "env_allows", "tell_not_per_sample"]
log = logging.getLogger("stoker")
_told: set[tuple[str, str]] = set()


def enabled(argument: bool) -> bool:
    """The fast paths for a loader built with ``fast_paths=argument``."""
    return bool(argument) and env_allows()


_WHY = {
    "torch": "it is one of torch's own dataset classes (or a tree of them) over plain CPU "
             "tensors, whose batch is exactly one gather per tensor (NOTE [ torch's own "
             "datasets ])",
    "source": "its batched form, read from its source, gave the same batches as calling it per "
              "sample on the probe batches, so each batch is computed as array gathers",
    "call": "its class declares stoker_tensor_index = True and the probe batches matched, so it "
            "is called once per batch with a tensor of indices",
    "inline": "its batched form, read from its source, gave the same batches as calling it per "
              "sample on the probe batches, so batches are computed as array gathers in the "
              "calling thread, with no worker processes",
}


def _name(dataset: Any) -> str:
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}"


def tell_not_per_sample(dataset: Any, how: str) -> None:
    """Log once per process and dataset class that ``__getitem__`` is not called per sample."""
    key = (_name(dataset), how)
    if not how or key in _told:
        return
    _told.add(key)
    log.log(
        ADVICE_LEVEL,
        "stoker: %s.__getitem__ is no longer called per sample: %s. "
        "DataLoader(fast_paths=False) or STOKER_FAST_PATHS=0 calls it per sample "
        "(NOTE [ One switch for the fast paths ]).", _name(dataset), _WHY[how],
    )
