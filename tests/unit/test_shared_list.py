"""stoker.sharing shared containers: values, indexing, errors, pickling and shared backing."""

from __future__ import annotations

import copy
import multiprocessing.resource_sharer
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

from stoker.sharing import SharedBytesList, SharedList, SharedStrList

STRINGS = ["a", "", "héllo wörld", "日本語のパス/画像.jpg", "emoji 🐍", "\udcff lone surrogate", ""]
BYTES = [b"", b"\x00\xff", b"abc", bytes(range(256)), b""]
OBJECTS = [1, None, "s", b"b", (1, "x"), {"k": [1, 2.5]}, [], 3.0, {1, 2}]


@pytest.fixture(autouse=True)
def _stop_resource_sharer() -> Iterator[None]:
    """ForkingPickler outside a process start sends fds through multiprocessing's resource
    sharer, a thread; stop it so no test leaves a thread behind."""
    yield
    multiprocessing.resource_sharer.stop(timeout=5.0)


CASES = [(SharedStrList, STRINGS), (SharedBytesList, BYTES), (SharedList, OBJECTS)]


@pytest.mark.parametrize(("cls", "items"), CASES)
def test_values_types_len_iter(cls: type, items: list) -> None:
    c = cls(items)
    assert len(c) == len(items)
    assert list(c) == items
    assert [c[i] for i in range(len(items))] == items
    assert [type(x) for x in c] == [type(x) for x in items]
    assert isinstance(c, Sequence)


@pytest.mark.parametrize(("cls", "items"), CASES)
def test_negative_indices_and_slices(cls: type, items: list) -> None:
    c = cls(items)
    assert c[-1] == items[-1]
    assert c[-len(items)] == items[0]
    assert c[np.int64(2)] == items[2]
    for s in (
        slice(None),
        slice(1, 4),
        slice(None, None, -1),
        slice(-3, None),
        slice(5, 1, -2),
        slice(100, 200),
        slice(0, 0),
    ):
        got = c[s]
        assert type(got) is list
        assert got == items[s]


@pytest.mark.parametrize(("cls", "items"), CASES)
def test_index_out_of_range(cls: type, items: list) -> None:
    c = cls(items)
    n = len(items)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError) as info:
            c[bad]
        assert str(info.value) == f"{cls.__name__} index {bad} out of range (len {n})"
    with pytest.raises(TypeError):
        c["0"]


@pytest.mark.parametrize("cls", [SharedStrList, SharedBytesList, SharedList])
def test_empty(cls: type) -> None:
    c = cls([])
    assert len(c) == 0
    assert list(c) == [] and c[:] == []
    assert c.offsets.tolist() == [0]
    assert c.buffer.size == 0
    with pytest.raises(IndexError):
        c[0]
    assert len(pickle.loads(pickle.dumps(c))) == 0
    assert repr(c) == f"{cls.__name__}(0 items, 0.0 MiB shared)"


def test_accepts_any_iterable() -> None:
    assert list(SharedStrList(str(i) for i in range(5))) == ["0", "1", "2", "3", "4"]
    assert list(SharedStrList(("x", "y"))) == ["x", "y"]
    assert list(SharedBytesList([bytearray(b"ab"), memoryview(b"cd")])) == [b"ab", b"cd"]


def test_fresh_objects() -> None:
    c = SharedList([{"a": [1]}])
    got = c[0]
    got["a"].append(2)
    assert c[0] == {"a": [1]}
    assert c[0] is not c[0]


def test_layout_and_read_only_views() -> None:
    c = SharedStrList(["ab", "", "é"])
    assert c.offsets.dtype == np.int64 and c.offsets.tolist() == [0, 2, 2, 4]
    assert c.buffer.dtype == np.uint8 and c.buffer.tobytes() == "abé".encode()
    assert c.nbytes == 8 * 4 + 4
    with pytest.raises(ValueError):
        c.buffer[0] = 1
    with pytest.raises(ValueError):
        c.offsets[0] = 1


def test_wrong_item_types() -> None:
    with pytest.raises(TypeError) as info:
        SharedStrList(["a", "b", 3])
    assert str(info.value) == (
        "SharedStrList holds str only; item 2 is int. Use stoker.formats.SharedList for "
        "arbitrary picklable objects."
    )
    with pytest.raises(TypeError) as info:
        SharedBytesList([b"a", "b"])
    assert str(info.value) == (
        "SharedBytesList holds bytes or bytearray only; item 1 is str. Use "
        "stoker.formats.SharedList for arbitrary picklable objects."
    )


def test_non_ascii_and_ascii_paths_agree() -> None:
    ascii_items = [f"/data/img_{i}.jpg" for i in range(1000)]
    mixed = [*ascii_items, "ü"]
    assert list(SharedStrList(ascii_items)) == ascii_items
    assert list(SharedStrList(mixed)) == mixed


@pytest.mark.parametrize(("cls", "items"), CASES)
def test_plain_pickle_round_trip_copies(cls: type, items: list) -> None:
    c = cls(items)
    data = pickle.dumps(c)
    assert len(data) >= c.nbytes  # the bytes travel: a file cannot carry an fd
    back = pickle.loads(data)
    assert type(back) is cls and list(back) == items
    assert _inode(back) != _inode(c)  # a new segment of its own
    assert list(copy.deepcopy(c)) == items


@pytest.mark.parametrize(("cls", "items"), CASES)
def test_forking_pickler_shares_the_segment(cls: type, items: list) -> None:
    """What spawn/forkserver workers and multiprocessing queues use: the fd travels, never
    the buffer, and the receiver maps the same segment."""
    big = items * 2000
    c = cls(big)
    data = bytes(ForkingPickler.dumps(c))
    assert len(data) < 1024 < c.nbytes
    back = pickle.loads(data)
    assert type(back) is cls and len(back) == len(big)
    assert back[0] == big[0] and back[-1] == big[-1] and list(back[:50]) == big[:50]
    assert _inode(back) == _inode(c)
    assert back._segment.fd != c._segment.fd


class Paths(SharedStrList):
    __slots__ = ()


def test_subclass_is_shared_too() -> None:
    c = Paths(["x"] * 10_000)
    data = bytes(ForkingPickler.dumps(c))
    assert len(data) < 1024
    back = pickle.loads(data)
    assert type(back) is Paths and back[-1] == "x" and _inode(back) == _inode(c)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_fd_closed_when_collected() -> None:
    c = SharedStrList(["x"])
    fd = c._segment.fd
    target = os.readlink(f"/proc/self/fd/{fd}")
    assert "memfd:" in target or "/dev/shm" in target
    del c
    assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != target


def _inode(c: object) -> int:
    return os.fstat(c._segment.fd).st_ino  # type: ignore[attr-defined]
