"""An exception from a worker is caught by the ``except`` clause that catches it under torch.

torch 2.13 (``ExceptionWrapper.reraise``) re-raises ``type(message)`` with the worker's
formatted traceback as the message: the original type whenever its constructor takes one
string, whatever its attributes hold. So an exception holding a lock or a lambda, a ``KeyError``
of an object, or one raised ``from`` another, comes back as its own type, and
``except ValueError:`` around the loop catches it. The tests marked torch-compatible state only
that, and pass with ``STOKER_TEST_LOADER=torch``; the rest check what stoker keeps beyond it
(the arguments, the attributes that pickle, ``OSError.filename``, the attributes builtin types
keep outside ``__dict__``), compared with the same error raised with ``num_workers=0``.

The exception classes are defined here, in the test module, as a user's would be.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import traceback
from collections.abc import Callable

import pytest
from _datasets import drop_tracebacks
from torch.utils.data import Dataset

FAIL_INDEX = 13  # in the batch [12, 13] with batch_size=2
LOADER_TIMEOUT_S = 60  # every blocking wait for a batch has a bound


class LockedError(ValueError):
    """Holds a lock, which does not pickle; its constructor takes one message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class CallbackError(ValueError):
    """Holds a lambda, which does not pickle."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry = lambda: "retried"


class TwoArgLockedError(ValueError):
    """A constructor with two required arguments, and a lock: torch gives RuntimeError."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail
        self.lock = threading.Lock()


class StrictNewError(ValueError):
    """``__new__`` wants the constructor's two arguments, not the one message in ``args``:
    neither stoker's rebuild nor torch's ``cls(message)`` can make one."""

    def __new__(cls, code: int, detail: str) -> StrictNewError:
        return super().__new__(cls, code, detail)

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"E{code}: {detail}")


def _strict_new(i: int, path: str) -> None:
    raise StrictNewError(7, f"sample {i}")


def _locked(i: int, path: str) -> None:
    err = LockedError(f"sample {i} is corrupt")
    err.sample = i  # a picklable attribute set after construction
    raise err


def _callback(i: int, path: str) -> None:
    raise CallbackError(f"sample {i} is corrupt")


def _two_arg_locked(i: int, path: str) -> None:
    raise TwoArgLockedError("E_CORRUPT", f"sample {i}")


def _lock_in_args(i: int, path: str) -> None:
    raise ValueError("cannot decode", threading.Lock())


def _key_of_lock(i: int, path: str) -> None:
    raise KeyError(threading.Lock())


def _locked_from_key(i: int, path: str) -> None:
    try:
        {}["inner-key"]
    except KeyError as inner:
        raise LockedError("outer") from inner


def _locked_during_key(i: int, path: str) -> None:
    try:
        {}["inner-key"]
    except KeyError:
        raise LockedError("outer")  # noqa: B904 -- the implicit __context__ chain is the point


def _open_missing(i: int, path: str) -> None:
    open(path, "rb")


def _rename_missing(i: int, path: str) -> None:
    os.rename(path, path + ".renamed")


def _bad_utf8(i: int, path: str) -> None:
    b"ok \xff".decode("utf-8")


def _missing_attribute(i: int, path: str) -> None:
    object().no_such_attribute  # noqa: B018


def _missing_module(i: int, path: str) -> None:
    __import__("stoker_test_no_such_module")


RAISERS: dict[str, Callable[[int, str], None]] = {
    "lock": _locked,
    "lambda": _callback,
    "two_arg_lock": _two_arg_locked,
    "key_of_lock": _key_of_lock,
    "lock_in_args": _lock_in_args,
    "cause": _locked_from_key,
    "context": _locked_during_key,
    "open": _open_missing,
    "rename": _rename_missing,
    "utf8": _bad_utf8,
    "attribute": _missing_attribute,
    "module": _missing_module,
    "strict_new": _strict_new,
}


class FailingDS(Dataset):
    """Raises ``RAISERS[kind]`` at ``FAIL_INDEX``; ``path`` names a file that does not exist."""

    def __init__(self, kind: str, path: str = "") -> None:
        self.kind = kind
        self.path = path

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> int:
        if i == FAIL_INDEX:
            RAISERS[self.kind](i, self.path)
        return i


def _raised(Loader, kind: str, num_workers: int, path: str = "") -> BaseException:
    """The exception an epoch over ``FailingDS(kind)`` raises."""
    timeout = LOADER_TIMEOUT_S if num_workers else 0
    loader = Loader(FailingDS(kind, path), batch_size=2, num_workers=num_workers, timeout=timeout)
    try:
        for _ in loader:
            pass
    except Exception as exc:
        # The traceback holds the iterator's frames: drop it so the workers stop now (the leak
        # check), keeping the worker-side text the tests read.
        text = _full_text(exc)
        drop_tracebacks(exc)
        exc.stoker_test_text = text  # type: ignore[attr-defined]
        return exc
    raise AssertionError(f"an epoch over FailingDS({kind!r}) raised nothing")


def _full_text(exc: BaseException) -> str:
    """Everything a user sees printed: traceback, notes, chained causes."""
    return "".join(traceback.format_exception(exc))


def _notes(exc: BaseException) -> list[str]:
    return list(getattr(exc, "__notes__", []))


def _names_worker_and_indices(exc: BaseException, traceback_is: str = "is chained above") -> None:
    where = _notes(exc)[-1]
    assert re.fullmatch(
        r"stoker: raised in DataLoader worker [01] \(pid \d+\) while loading sample index "
        r"13 \(its batch: sample indices \[12, 13\]\); the worker's traceback "
        + re.escape(traceback_is) + r"\.",
        where,
    ), where


# --------------------------------------------------------------------------------------------
# Values that do not pickle: the same type as torch's, caught by the same except clause
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,cls", [("lock", LockedError), ("lambda", CallbackError)], ids=["lock", "lambda"]
)
def test_exception_holding_an_unpicklable_value_keeps_its_type(Loader, kind, cls):
    """torch-compatible: torch re-raises ``cls(message)``; ``except ValueError`` catches it."""
    exc = _raised(Loader, kind, num_workers=2)
    assert type(exc) is cls
    assert isinstance(exc, ValueError)
    assert f"sample {FAIL_INDEX} is corrupt" in str(exc)
    raiser = RAISERS[kind].__name__  # the raising function, from the worker's traceback
    assert f", in {raiser}\n" in exc.stoker_test_text


def test_unpicklable_value_is_left_out_and_named(Loader, stoker_only):
    exc = _raised(Loader, "lock", num_workers=2)
    assert type(exc) is LockedError
    assert exc.args == (f"sample {FAIL_INDEX} is corrupt",)
    assert exc.sample == FAIL_INDEX  # the attribute that pickles travelled
    assert isinstance(exc.lock, type(threading.Lock()))  # made again by the constructor
    left_out, _ = _notes(exc)
    assert left_out == (
        "stoker: attribute 'lock' (_thread.lock) could not be pickled in the worker and did "
        "not travel to the main process; the LockedError was rebuilt here by calling "
        "LockedError(*args), so it holds what that constructor sets. Keep picklable values on "
        "exceptions (a string, not a lock or a function) to get them back whole."
    )
    _names_worker_and_indices(exc)
    assert ", in _locked\n" in exc.stoker_test_text  # the worker's traceback


def test_lambda_made_again_by_the_constructor_works(Loader, stoker_only):
    exc = _raised(Loader, "lambda", num_workers=2)
    assert exc.retry() == "retried"
    assert "attribute 'retry' (function) could not be pickled" in _notes(exc)[0]


def test_two_argument_constructor_is_a_runtime_error_as_in_torch(Loader):
    """torch-compatible: ``cls(message)`` wants two arguments, so torch raises RuntimeError,
    and ``except RuntimeError`` around the loop must catch it under stoker too."""
    exc = _raised(Loader, "two_arg_lock", num_workers=2)
    assert type(exc) is RuntimeError
    text = str(exc)
    assert re.match(r"Caught TwoArgLockedError in DataLoader worker process [01]\.\n"
                    r"Original Traceback \(most recent call last\):\n", text), text
    assert text.endswith(
        "TwoArgLockedError: ('E_CORRUPT', 'sample 13')\n"), text
    assert exc.args == (text,)


def test_two_argument_constructor_keeps_type_and_arguments_as_the_cause(Loader, stoker_only):
    """stoker chains the original beneath torch's RuntimeError, its constructor called with
    the two arguments that travelled."""
    outer = _raised(Loader, "two_arg_lock", num_workers=2)
    exc = outer.__cause__
    assert type(exc) is TwoArgLockedError
    assert _notes(outer) == [
        "stoker: the TwoArgLockedError itself, with its arguments and attributes, is chained "
        "above (this exception's __cause__); torch raises RuntimeError where a "
        "TwoArgLockedError cannot be made from one message, and so does stoker."
    ]
    assert exc.args == ("E_CORRUPT", f"sample {FAIL_INDEX}")
    assert (exc.code, exc.detail) == ("E_CORRUPT", f"sample {FAIL_INDEX}")
    assert isinstance(exc.lock, type(threading.Lock()))
    note = "the TwoArgLockedError was rebuilt here by calling TwoArgLockedError(*args)"
    assert note in _notes(exc)[0]
    _names_worker_and_indices(exc, "is in the message below")


def test_key_error_of_an_unpicklable_key_is_a_key_error(Loader):
    """torch-compatible: torch re-raises ``KeyError(message)``."""
    exc = _raised(Loader, "key_of_lock", num_workers=2)
    assert type(exc) is KeyError
    assert "_key_of_lock" in exc.stoker_test_text


def test_key_error_of_an_unpicklable_key_names_the_key(Loader, stoker_only):
    exc = _raised(Loader, "key_of_lock", num_workers=2)
    (key,) = exc.args
    assert re.fullmatch(r"<unlocked _thread\.lock object at 0x[0-9a-f]+>", key), key
    assert _notes(exc)[0].startswith(
        "stoker: argument 0 (_thread.lock, replaced by its repr) could not be pickled"
    )
    assert "rebuilt here from what travelled." in _notes(exc)[0]  # no constructor called
    _names_worker_and_indices(exc)


def test_an_argument_that_does_not_pickle_reads_as_in_the_worker(Loader):
    """torch-compatible: the message's last line (torch's) and stoker's ``str`` show the lock
    as the worker showed it, not as a quoted string (found by a sweep)."""
    exc = _raised(Loader, "lock_in_args", num_workers=2)
    last = str(exc).rstrip("\n").splitlines()[-1].removeprefix("ValueError: ")
    assert re.fullmatch(r"\('cannot decode', <unlocked _thread\.lock object at 0x[0-9a-f]+>\)",
                        last), last


@pytest.mark.parametrize(
    "kind,link",
    [
        ("cause", "The above exception was the direct cause of the following exception"),
        ("context", "During handling of the above exception, another exception occurred"),
    ],
)
def test_chained_exception_keeps_its_type_and_shows_the_chain(Loader, kind, link):
    """torch-compatible: the type, and the whole chain in what is printed."""
    exc = _raised(Loader, kind, num_workers=2)
    assert type(exc) is LockedError
    text = exc.stoker_test_text
    assert "KeyError: 'inner-key'" in text
    assert link in text
    assert text.index("KeyError: 'inner-key'") < text.index("LockedError: outer")


def test_exception_class_that_cannot_be_pickled_says_where_to_define_it(Loader, stoker_only):
    """A class made inside a function cannot be sent at all (torch's worker fails to send it
    and the loader waits until its timeout); stoker says so."""
    loader = Loader(_LocalErrorDS(), batch_size=2, num_workers=2, timeout=LOADER_TIMEOUT_S)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    exc = info.value
    del info
    first_line = str(exc).splitlines()[0]
    drop_tracebacks(exc)
    assert re.fullmatch(
        r"Caught _LocalErrorDS\.__getitem__\.<locals>\.LocalError in DataLoader worker [01] "
        r"\(pid \d+\) while loading sample index 13 \(its batch: sample indices \[12, 13\]\), "
        r"and it could not be sent to the "
        r"main process \(its class does not pickle: define it at the top level of an "
        r"importable module\)\. The worker's traceback:",
        first_line,
    ), first_line


def test_exception_that_cannot_be_rebuilt_is_a_runtime_error_as_in_torch(Loader):
    """torch-compatible: ``RuntimeError`` whose message says what was caught, with the
    worker's traceback."""
    exc = _raised(Loader, "strict_new", num_workers=2)
    assert type(exc) is RuntimeError
    text = str(exc)
    assert text.startswith("Caught StrictNewError in DataLoader worker ")
    assert "\nOriginal Traceback (most recent call last):\n" in text
    assert ", in _strict_new\n" in text
    assert text.endswith(f"StrictNewError: E7: sample {FAIL_INDEX}\n")


def test_exception_that_cannot_be_rebuilt_names_worker_and_indices(Loader, stoker_only):
    """torch's message, and stoker's account of the worker and the samples in a note."""
    exc = _raised(Loader, "strict_new", num_workers=2)
    first_line = str(exc).splitlines()[0]
    assert re.fullmatch(r"Caught StrictNewError in DataLoader worker process [01]\.",
                        first_line), first_line
    (note,) = _notes(exc)
    assert re.fullmatch(
        r"stoker: raised in DataLoader worker [01] \(pid \d+\) while loading sample "
        r"index 13 \(its batch: sample indices \[12, 13\]\)\.",
        note,
    ), note


class _LocalErrorDS(FailingDS):
    def __init__(self) -> None:
        super().__init__("lock")

    def __getitem__(self, i: int) -> int:
        class LocalError(ValueError):
            pass

        if i == FAIL_INDEX:
            raise LocalError("made in a function")
        return i


# --------------------------------------------------------------------------------------------
# OSError.filename and the other attributes builtins keep outside __dict__
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["open", "rename"])
def test_file_not_found_names_the_path(Loader, tmp_path, kind):
    """torch-compatible: a FileNotFoundError whose message names the missing file."""
    missing = str(tmp_path / "missing.bin")
    exc = _raised(Loader, kind, num_workers=2, path=missing)
    assert type(exc) is FileNotFoundError
    assert repr(missing) in str(exc)


BUILTIN_ATTRIBUTES = {
    "open": ("errno", "strerror", "filename", "filename2"),
    "rename": ("errno", "strerror", "filename", "filename2"),
    "utf8": ("encoding", "object", "start", "end", "reason"),
    "attribute": ("name",),
    "module": ("name", "path"),
}


@pytest.mark.parametrize("kind", list(BUILTIN_ATTRIBUTES))
def test_builtin_attributes_as_without_workers(Loader, stoker_only, tmp_path, kind):
    """Type, message, ``args`` and the attributes a builtin keeps outside ``__dict__`` are
    those the same error has with ``num_workers=0``."""
    missing = str(tmp_path / "missing.bin")
    inline = _raised(Loader, kind, num_workers=0, path=missing)
    exc = _raised(Loader, kind, num_workers=2, path=missing)
    traceback_is = "is chained above"
    if kind in NOT_FROM_ONE_MESSAGE:  # torch's RuntimeError, the original as its cause
        assert type(exc) is RuntimeError
        exc, traceback_is = exc.__cause__, "is in the message below"
    assert type(exc) is type(inline)
    assert str(exc) == str(inline)
    assert exc.args == inline.args
    names = BUILTIN_ATTRIBUTES[kind]
    assert [getattr(exc, n) for n in names] == [getattr(inline, n) for n in names]
    _names_worker_and_indices(exc, traceback_is)


NOT_FROM_ONE_MESSAGE = {"utf8"}  # UnicodeDecodeError wants five arguments


@pytest.mark.parametrize("kind", sorted(NOT_FROM_ONE_MESSAGE))
def test_builtin_that_needs_more_arguments_is_a_runtime_error_as_in_torch(Loader, kind):
    """torch-compatible: ``UnicodeDecodeError(message)`` cannot be made, so torch raises
    RuntimeError, and ``except ValueError`` (UnicodeDecodeError's base) does not catch it."""
    exc = _raised(Loader, kind, num_workers=2)
    assert type(exc) is RuntimeError
    assert str(exc).startswith("Caught UnicodeDecodeError in DataLoader worker process ")


def test_os_error_attributes_from_open(Loader, stoker_only, tmp_path):
    missing = str(tmp_path / "missing.bin")
    exc = _raised(Loader, "open", num_workers=2, path=missing)
    assert (exc.errno, exc.strerror, exc.filename, exc.filename2) == (
        errno.ENOENT,
        os.strerror(errno.ENOENT),
        missing,
        None,
    )
    assert str(exc) == f"[Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}: {missing!r}"
