"""Errors in user code (dataset, collate_fn) reach the main loop intact, with context.

torch rebuilds a worker's exception as ``type(message)``: an exception whose constructor needs
other arguments becomes a ``RuntimeError`` and loses its attributes. The loader under test
gives back the original type, arguments and attributes, says which worker and which sample
indices failed (message or ``__notes__``), and keeps the worker-side traceback (``__notes__``
or the chained ``__cause__``). Afterwards the loader runs a new epoch and nothing is leaked
(the leak check in conftest.py).
"""

from __future__ import annotations

import re
import traceback

import pytest
from _datasets import (
    CodedError,
    FailingCollate,
    MessageOnlyCodedError,
    RaisingDS,
    UnpicklableError,
    drop_tracebacks,
    read_records,
)

NUM_WORKERS = [0, 2]
FAIL_INDEX = 13  # in the batch [12, 13] with batch_size=2


def _raise_from(loader, expected: type | tuple[type, ...]) -> BaseException:
    """Run an epoch that must raise ``expected``; return the exception."""
    with pytest.raises(expected) as info:
        for _ in loader:
            pass
    exc = info.value
    del info
    return exc


def _context_text(exc: BaseException) -> str:
    """The message and the notes, the cause's too (where torch's type is RuntimeError, the
    original is its cause): where the worker id and the indices must be named."""
    parts = [str(exc), *getattr(exc, "__notes__", [])]
    if exc.__cause__ is not None:
        parts.append(_context_text(exc.__cause__))
    return "\n".join(parts)


def _full_text(exc: BaseException) -> str:
    """Everything a user sees printed: traceback, notes, chained causes."""
    return "".join(traceback.format_exception(exc))


# --------------------------------------------------------------------------------------------
# Type, arguments and attributes
# --------------------------------------------------------------------------------------------

CUSTOM = {
    "coded": (CodedError, ("E_BAD_SAMPLE", "the sample is corrupt")),
    "message_only": (MessageOnlyCodedError, ("E_BAD_SAMPLE: the sample is corrupt",)),
}


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize("kind", list(CUSTOM))
def test_custom_exception_keeps_type_and_attributes(Loader, loader_name, kind, num_workers):
    """From a worker, torch raises RuntimeError (neither class is made from torch's message),
    and so does stoker, with the original, whole, as its cause."""
    if loader_name == "torch" and num_workers > 0:
        pytest.skip("torch turns it into RuntimeError (test_torch_loses_custom_exceptions)")
    cls, args = CUSTOM[kind]
    loader = Loader(RaisingDS(kind), batch_size=2, num_workers=num_workers)
    raised = _raise_from(loader, RuntimeError if num_workers else cls)
    exc = raised.__cause__ if num_workers else raised
    assert type(raised) is (RuntimeError if num_workers else cls)
    assert type(exc) is cls
    assert exc.args == args
    assert exc.code == "E_BAD_SAMPLE"
    assert exc.detail == "the sample is corrupt"
    drop_tracebacks(raised)


def test_torch_loses_custom_exceptions(TorchLoader):
    """Documents the difference: torch gives RuntimeError without the attributes."""
    exc = _raise_from(TorchLoader(RaisingDS("coded"), batch_size=2, num_workers=2), Exception)
    assert type(exc) is RuntimeError
    assert not hasattr(exc, "code")
    assert "Caught CodedError in DataLoader worker process" in str(exc)
    drop_tracebacks(exc)


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_error_names_worker_indices_and_keeps_traceback(Loader, loader_name, tmp_path, num_workers):
    record = str(tmp_path / "raised.jsonl")
    loader = Loader(RaisingDS("coded", record_path=record), batch_size=2, num_workers=num_workers)
    exc = _raise_from(loader, Exception)
    # The raising frame's function name, from the worker-side traceback.
    assert "_raise_coded_error_in_getitem" in _full_text(exc)
    if loader_name == "stoker":
        (rec,) = read_records(record)
        assert rec["index"] == FAIL_INDEX
        text = _context_text(exc)
        assert re.search(r"\bind(ex|ices)\b", text, re.I), f"no sample index named in:\n{text}"
        assert re.search(rf"\b{FAIL_INDEX}\b", text), f"index {FAIL_INDEX} not named in:\n{text}"
        if num_workers > 0:
            wid = rec["worker_id"]
            assert re.search(rf"worker\D{{0,20}}\b{wid}\b", text, re.I), (
                f"worker id {wid} not named in:\n{text}"
            )
    drop_tracebacks(exc)


# --------------------------------------------------------------------------------------------
# Builtin exceptions in __getitem__
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize(
    "kind,cls,args",
    [("key", KeyError, ("missing-key",)), ("value", ValueError, ("bad value in sample",))],
    ids=["KeyError", "ValueError"],
)
def test_builtin_exceptions_in_getitem(Loader, loader_name, kind, cls, args, num_workers):
    exc = _raise_from(Loader(RaisingDS(kind), batch_size=2, num_workers=num_workers), cls)
    assert type(exc) is cls
    assert args[0] in str(exc)
    if loader_name == "stoker" or num_workers == 0:
        assert exc.args == args  # torch's workers put the whole traceback in the message
    assert f"_raise_{kind}_error_in_getitem" in _full_text(exc)
    drop_tracebacks(exc)


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_stop_iteration_in_getitem_is_an_error(Loader, stoker_only, num_workers):
    """A StopIteration escaping a map dataset's __getitem__ is a bug in the dataset; torch
    silently ends the epoch there (see the next test). It must surface as an error, like
    PEP 479 does for generators, instead of truncating the epoch."""
    loader = Loader(RaisingDS("stop"), batch_size=2, num_workers=num_workers)
    seen: list = []
    with pytest.raises(RuntimeError) as info:
        for batch in loader:
            seen.append(batch)
    exc = info.value
    del info
    assert len(seen) <= FAIL_INDEX // 2
    assert "StopIteration" in _full_text(exc)
    drop_tracebacks(exc)


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_torch_truncates_the_epoch_on_stop_iteration(TorchLoader, num_workers):
    """Documents torch: the epoch just ends at the batch holding index 13."""
    it = iter(TorchLoader(RaisingDS("stop"), batch_size=2, num_workers=num_workers))
    batches = []
    while True:
        try:
            batches.append(next(it))
        except StopIteration as stop:
            drop_tracebacks(stop)  # else torch's workers live until a gc (see drop_tracebacks)
            break
    del it
    assert len(batches) == FAIL_INDEX // 2


# --------------------------------------------------------------------------------------------
# collate_fn, and exceptions that cannot travel
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_exception_in_collate_fn(Loader, num_workers):
    loader = Loader(
        RaisingDS("value", fail_index=-1),
        batch_size=2,
        num_workers=num_workers,
        collate_fn=FailingCollate(FAIL_INDEX),
    )
    exc = _raise_from(loader, ValueError)
    assert "collate cannot handle [12, 13]" in str(exc)
    assert "_raise_in_collate" in _full_text(exc)
    drop_tracebacks(exc)


def test_unpicklable_exception_from_worker(Loader):
    # As torch: the original type (rebuilt from what travels), so `except` clauses still match.
    exc = _raise_from(Loader(RaisingDS("unpicklable"), batch_size=2, num_workers=2),
                      UnpicklableError)
    assert "cannot travel" in str(exc)
    assert "_raise_unpicklable_error_in_getitem" in _full_text(exc)
    drop_tracebacks(exc)


def test_unpicklable_exception_without_workers_is_the_original(Loader):
    exc = _raise_from(Loader(RaisingDS("unpicklable"), batch_size=2), UnpicklableError)
    assert exc.args == ("cannot travel",)
    assert hasattr(exc, "lock")
    drop_tracebacks(exc)


# --------------------------------------------------------------------------------------------
# After the error: a new epoch works
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_workers,persistent", [(0, False), (2, False), (2, True)], ids=["nw0", "nw2", "nw2-pers"]
)
@pytest.mark.parametrize("kind", ["coded", "value"])
def test_new_epoch_after_an_error(Loader, loader_name, tmp_path, kind, num_workers, persistent):
    flag = tmp_path / "armed"
    flag.touch()
    loader = Loader(
        RaisingDS(kind, flag_path=str(flag)),
        batch_size=2,
        num_workers=num_workers,
        persistent_workers=persistent,
    )
    expected_type = CodedError if kind == "coded" else ValueError
    if num_workers > 0 and kind == "coded":  # not made from torch's message: RuntimeError
        expected_type = RuntimeError
    drop_tracebacks(_raise_from(loader, expected_type))
    flag.unlink()
    for _ in range(2):
        batches = [b.tolist() for b in loader]
        assert batches == [[i, i + 1] for i in range(0, 22, 2)] + [[22]]
    del loader
