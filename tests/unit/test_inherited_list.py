"""NOTE [ Reading inherited lists in place ]: values read through object addresses equal the
list's items, of the same types, for every supported kind; anything else is the object."""

from __future__ import annotations

import pickle
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stoker.sharing import inherited_list
from stoker.sharing.inherited_list import InheritedList

pytestmark = pytest.mark.skipif(
    not inherited_list.available(), reason="this interpreter's object layout is not read"
)


def fresh(s: str) -> str:
    """An equal str that is a new object (not a literal or interned constant)."""
    return "".join([s[:1], s[1:]])


PLAIN = [
    fresh("/data/train/img_00000001.jpg"),  # ASCII
    fresh("héllo wörld"),  # latin-1
    fresh("日本語のパス/画像.jpg"),  # UCS-2
    fresh("emoji 🐍"),  # UCS-4
    fresh("\udcff lone surrogate"),  # os.fsdecode of an undecodable name
    "",
    b"".join([b"\x00\xff", b"abc"]),
    b"",
    0,
    1,
    -1,
    2**30,
    -(2**30) + 1,
    2**64 + 12345,
    -(10**50),
    0.1 + 0.2,
    float("-inf"),
    True,
    False,
    None,
    (fresh("/x/a.jpg"), 7),
    (),
    ((1, (2.5, (None, (b"deep",)))), "t"),
]


def test_this_cpython_is_read() -> None:
    assert sys.implementation.name == "cpython" and inherited_list.layout() is not None


def test_every_plain_kind_reads_back_equal_with_its_type() -> None:
    view = InheritedList(PLAIN)
    assert len(view) == len(PLAIN)
    for got, want in zip(view, PLAIN, strict=True):
        assert type(got) is type(want) and got == want, (got, want)
    assert [view[i] for i in range(len(PLAIN))] == PLAIN


def test_plain_items_are_new_objects_and_others_are_the_objects_themselves() -> None:
    rich = {"k": [1, 2]}
    items = [fresh("path"), rich, fresh("x")]
    view = InheritedList(items)
    assert view[0] == items[0] and view[0] is not items[0]  # read, not referenced
    assert view[1] is rich  # a dict is not read in place: the object itself, as a list gives


def test_sequence_api_indexing_slicing_iteration() -> None:
    items = [fresh(f"/p/{i}") for i in range(10_000)]  # iteration crosses read chunks
    view = InheritedList(items)
    assert list(view) == items and view == items and items == view
    assert view[-1] == items[-1] and view[3:9:2] == items[3:9:2] and view[::-1][:3] == items[:-4:-1]
    assert "/p/42" in view and view.index("/p/42") == 42 and view.count("/p/7") == 1
    with pytest.raises(IndexError):
        view[10_000]
    with pytest.raises(TypeError, match="stoker_share_lists = False"):
        view[0] = "x"
    with pytest.raises(TypeError):
        hash(view)
    assert len(InheritedList([])) == 0 and list(InheritedList([])) == []


def test_pickles_as_the_plain_list_it_shows() -> None:
    view = InheritedList(list(PLAIN))
    back = pickle.loads(pickle.dumps(view))
    assert type(back) is list and back == PLAIN


def test_only_plain_lists_are_viewed() -> None:
    with pytest.raises(TypeError, match="plain list"):
        InheritedList((1, 2))  # type: ignore[arg-type]


def test_reads_back_checks_a_sample() -> None:
    items = [fresh(f"/p/{i}") for i in range(100)]
    assert inherited_list.reads_back(items, range(0, 100, 7))


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4).map(tuple),
    max_leaves=12,
)


@given(st.lists(plain_values, max_size=20))
def test_any_plain_value_reads_back(items: list) -> None:
    view = InheritedList(items)
    assert list(view) == items
    assert [type(x) for x in view] == [type(x) for x in items]
