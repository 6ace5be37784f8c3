"""``stoker.StatefulDataLoader``: the name code written for torchdata imports.

``from stoker import StatefulDataLoader`` replaces
``from torchdata.stateful_dataloader import StatefulDataLoader``: the same constructor
(torch's arguments plus ``snapshot_every_n_steps``), ``state_dict()`` / ``load_state_dict()``
with torchdata's documented semantics (the state of the last batch received; loading applies to
the next ``iter()``; before iterating it is the initial state; an ``IterableDataset`` or its
iterator with ``state_dict``/``load_state_dict`` is restored through them instead of being read
again). The state's format is stoker's own (a torchdata state is refused with a message that
says so). Differences, all deliberate, are listed in docs/from_torchdata.md.
"""

from __future__ import annotations

from typing import TypeVar

from stoker.loader import DataLoader

T_co = TypeVar("T_co", covariant=True)


class StatefulDataLoader(DataLoader[T_co]):
    """``stoker.DataLoader`` under torchdata's name; see the module docstring."""
