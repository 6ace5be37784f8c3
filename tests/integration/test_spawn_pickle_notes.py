"""NOTE [ What spawn cannot send ]: a loader whose dataset, collate_fn or worker_init_fn does not
pickle fails to start spawn/forkserver workers with torch's error (same type, same text, as
torch's ``Process.start`` raises it), plus a note naming the argument or the dataset's
attribute, why the start method needs it pickled, and the fix."""

from __future__ import annotations

import threading
from typing import Any

import psutil
import pytest
import torch
from _datasets import MapDS, UnpicklableDS

import stoker

WHY = ("stoker: with the {method!r} start method each worker is a new Python process, which "
       "receives the dataset, collate_fn and worker_init_fn by pickle; ")
FIX_FUNCTION = ("To fix it, define it with `def` at the top level of a module the workers can "
                "import (not inside a function, not a lambda); or pass "
                "multiprocessing_context='fork', whose workers inherit them instead.")
FIX_OBJECT = ("To fix it, create it in each worker instead (in worker_init_fn, or on first use "
              "in __getitem__), or leave it out of the pickle with __getstate__; or pass "
              "multiprocessing_context='fork', whose workers inherit them instead.")


class HoldsALock(MapDS):
    """The lock sits deep: ``dataset.parts['b'][20]``, after 20 items that pickle."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: dict[str, Any] = {"a": [1, 2], "b": [0] * 20 + [threading.Lock()]}


def _start_error(cls: type, dataset: Any, **kwargs: Any) -> BaseException:
    loader = cls(dataset, batch_size=4, timeout=60, **kwargs)
    with pytest.raises(Exception) as info:
        iter(loader)
    return info.value


def _cases() -> dict[str, tuple[Any, dict[str, Any], str]]:
    def init_here(worker_id: int) -> None:
        pass

    return {
        "lambda collate_fn": (MapDS(), {"collate_fn": lambda batch: batch},
                              "collate_fn cannot be pickled: it is a lambda. " + FIX_FUNCTION),
        "dataset attribute": (UnpicklableDS(), {},
                              "dataset.fn cannot be pickled: it is a lambda. " + FIX_FUNCTION),
        "local worker_init_fn": (
            MapDS(), {"worker_init_fn": init_here},
            "worker_init_fn cannot be pickled: it is _cases.<locals>.init_here, a function "
            "defined inside a function. " + FIX_FUNCTION),
        "a lock deep in the dataset": (
            HoldsALock(), {},
            "dataset.parts['b'][20] cannot be pickled: it is a _thread.lock object. "
            + FIX_OBJECT),
    }


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")  # torch's own hint
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # torch's __del__
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("case", list(_cases()))
def test_what_cannot_be_pickled_is_named_with_torchs_error(case, method, num_workers):
    dataset, kwargs, said = _cases()[case]
    kwargs = dict(kwargs, num_workers=num_workers, multiprocessing_context=method)
    theirs = _start_error(torch.utils.data.DataLoader, dataset, **kwargs)
    before = len(psutil.Process().children())  # torch's queues started the resource tracker
    ours = _start_error(stoker.DataLoader, dataset, **kwargs)
    assert len(psutil.Process().children()) == before  # no worker started
    assert type(ours) is type(theirs)  # what code catching torch's error catches
    assert str(ours) == str(theirs)
    assert getattr(ours, "__notes__", []) == [WHY.format(method=method) + said]

