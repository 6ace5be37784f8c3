"""NOTE [ What spawn cannot send ]: the search for what in a worker's spec does not pickle (no
process is started: the search pickles into nothing)."""

from __future__ import annotations

import functools
import io
import threading
from typing import Any

import numpy as np
import torch

from stoker._core.specs import FetchSpec, WorkerSpec
from stoker.workers import pickle_culprit


class Plain:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def _double(x: int) -> int:
    return 2 * x


def _spec(dataset: Any, collate_fn: Any = torch.utils.data.default_collate,
          worker_init_fn: Any = None) -> WorkerSpec:
    fetch = FetchSpec(dataset, "map", True, collate_fn, False)
    return WorkerSpec(worker_id=0, num_workers=1, fetch=fetch, base_seed=0,
                      worker_init_fn=worker_init_fn, max_idle_slabs=2, parent_pid=0,
                      first_epoch=0, seed_per_batch=False)


def _note(spec: WorkerSpec) -> str | None:
    exc = TypeError("cannot pickle")
    pickle_culprit.explain(exc, spec, "spawn")
    notes = getattr(exc, "__notes__", [])
    assert len(notes) <= 1
    return notes[0] if notes else None


def _blamed(spec: WorkerSpec) -> str:
    note = _note(spec)
    assert note is not None
    return note.split("; ", 1)[1].split(" cannot be pickled: it is ")[0]


def test_a_spec_that_pickles_gets_no_note():
    tensors = Plain(x=torch.zeros(1000), a=np.zeros(1 << 17), f=_double)
    assert _note(_spec(tensors, worker_init_fn=_double)) is None


def test_the_path_reaches_through_attributes_items_and_partials():
    lock = threading.Lock()
    cases = {
        "dataset.a.b": Plain(a=Plain(b=lambda: 0)),
        "dataset.table['key'][1]": Plain(table={"other": 1, "key": (1, lock)}),
        "dataset.fn.args[0]": Plain(fn=functools.partial(_double, lock)),
        "dataset.fn.keywords['x']": Plain(fn=functools.partial(_double, x=lock)),
        "dataset.method.__self__.lock": Plain(method=Plain(lock=lock).__init__),
        "dataset.items[70000]": Plain(items=[0] * 70_000 + [lock] + [1] * 5),
    }
    for path, dataset in cases.items():
        assert _blamed(_spec(dataset)) == path


def test_tensors_are_not_moved_to_shared_memory_by_the_search():
    x = torch.zeros(100)
    assert _blamed(_spec(Plain(x=x, f=lambda: 0))) == "dataset.f"
    assert not x.is_shared()


def test_the_first_of_the_loaders_functions_that_fails_is_named():
    assert _blamed(_spec(Plain(), collate_fn=lambda b: b)) == "collate_fn"
    assert _blamed(_spec(Plain(), worker_init_fn=lambda w: None)) == "worker_init_fn"
    assert _blamed(_spec(Plain(f=lambda: 0), collate_fn=lambda b: b)) == "dataset.f"


def test_a_cycle_does_not_loop():
    a = Plain()
    a.me, a.file = a, io.BytesIO(b"x")
    a.file.close()
    a.f = lambda: 0
    assert _blamed(_spec(a)) in ("dataset.f", "dataset.file")


def test_objects_are_described_with_their_fix():
    def local() -> None:
        pass

    class Local:
        pass

    note = _note(_spec(Plain(f=local)))
    assert note is not None and (
        "dataset.f cannot be pickled: it is test_objects_are_described_with_their_fix.<locals>."
        "local, a function defined inside a function. To fix it, define it with `def` at the "
        "top level of a module") in note
    note = _note(_spec(Local()))
    assert note is not None and (
        "dataset cannot be pickled: it is an instance of test_objects_are_described_with_"
        "their_fix.<locals>.Local, a class defined inside a function. To fix it, define the "
        "class at the top level of a module the workers can import; or pass "
        "multiprocessing_context='fork', whose workers inherit them instead.") in note
