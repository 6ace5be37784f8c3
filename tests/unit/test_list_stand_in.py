"""``ListStandIn`` (what a forked worker sees for a large list) answers as the list does, and a
change goes to a copy of its own (NOTE [ Automatic list sharing ])."""

from __future__ import annotations

import copy
import pickle

import pytest

from stoker.sharing import SharedList
from stoker.sharing.stand_in import ListStandIn

ITEMS = [3, 1.5, "a", None, (1, "b"), b"x", 3]


@pytest.fixture
def pair():
    return list(ITEMS), ListStandIn(SharedList(ITEMS))


def test_reads_answer_as_the_list(pair):
    plain, stand_in = pair
    assert stand_in == plain and plain == stand_in and not stand_in != plain
    assert len(stand_in) == len(plain) and list(stand_in) == plain
    assert stand_in[1:4] == plain[1:4] and stand_in[-1] == plain[-1]
    assert str(stand_in) == str(plain) and repr(stand_in) == repr(plain)
    assert stand_in.copy() == plain.copy() and type(stand_in.copy()) is list
    assert stand_in + ["z"] == plain + ["z"] and ["z"] + stand_in == ["z"] + plain
    assert stand_in * 2 == plain * 2 and 2 * stand_in == 2 * plain
    assert stand_in.index(3) == 0 and stand_in.count(3) == 2 and (1, "b") in stand_in
    assert list(reversed(stand_in)) == list(reversed(plain))
    assert pickle.loads(pickle.dumps(stand_in)) == plain
    assert type(pickle.loads(pickle.dumps(stand_in))) is list
    assert copy.deepcopy(stand_in) == plain


def test_comparisons_and_errors_answer_as_the_list():
    plain, stand_in = [1, 2], ListStandIn(SharedList([1, 2]))
    assert (stand_in < [1, 3], stand_in <= [1, 2], stand_in > [1], stand_in >= [1, 2]) == (
        plain < [1, 3], plain <= [1, 2], plain > [1], plain >= [1, 2])
    with pytest.raises(TypeError) as info:
        stand_in + (3,)
    with pytest.raises(TypeError) as theirs:
        plain + (3,)  # type: ignore[operator]
    assert str(info.value) == str(theirs.value)
    with pytest.raises(TypeError):
        hash(stand_in)


def test_a_change_goes_to_a_copy_of_its_own(pair):
    plain, stand_in = pair
    shared = stand_in._items
    for obj in (plain, stand_in):
        obj.append(7)
        obj[0] = 0
        obj += [8]
        del obj[1]
        obj.insert(0, "first")
        obj.remove(None)
        assert obj.pop() == 8
    assert stand_in == plain and stand_in._items is None
    assert list(shared) == ITEMS  # the shared source never changes
    stand_in.clear()
    assert stand_in == [] and len(stand_in) == 0
