"""NOTE [ Accelerate's one loader file ]: a rank's own file stands in for Accelerate's shared
state only where the two are at one place of one epoch (a file left from an older save is not
used)."""

from __future__ import annotations

from typing import Any

from stoker.integrations.accelerate_state import _own_file, _own_or_shared


class Adapter:
    """Stands for Accelerate's ``DataLoaderShard``: records what it was given to load."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def load_state_dict(self, state: Any) -> None:
        self.got.append(state)


def _state(rank: int, batches: int) -> dict[str, Any]:
    return {"iterations": 1, "epoch": 0, "batches": batches, "world_size": 2, "rank": rank}


def test_a_ranks_own_state_stands_in_for_the_shared_one_at_the_same_place() -> None:
    dl, loaded = Adapter(), []
    own, shared = _state(1, 3), {**_state(0, 3), "_iterator_finished": False}
    _own_or_shared(dl, own, loaded, shared)
    assert dl.got == [own] and loaded == [True]


def test_an_own_state_from_an_older_save_is_not_used() -> None:
    dl, loaded = Adapter(), []
    own, shared = _state(1, 2), _state(0, 5)
    _own_or_shared(dl, own, loaded, shared)
    assert dl.got == [shared] and loaded == [True]


def test_the_own_files_follow_accelerates_numbering() -> None:
    assert _own_file("ckpt", 0, 1).as_posix() == "ckpt/stoker_dl_state_dict_rank1.bin"
    assert _own_file("ckpt", 2, 0).as_posix() == "ckpt/stoker_dl_state_dict_2_rank0.bin"
