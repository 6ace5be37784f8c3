"""NOTE [ Automatic list sharing ]: which lists are shared, and when a container is rebuilt."""

from __future__ import annotations

import pytest

from stoker.formats import SharedBytesList, SharedList, SharedStrList
from stoker.formats.auto_share import MIN_ITEMS, ListSharing, apply_in_worker


class Holder:
    def __init__(self, items):
        self.items = items


class Paths:
    def __init__(self, n=MIN_ITEMS):
        self.paths = [f"/data/{i:08d}.jpg" for i in range(n)]
        self.meta = Holder([(f"/x/{i}", i % 7) for i in range(n)])
        self.small = ["a", "b"]
        self.mixed = ["a"] * (n - 1) + [object()]


def _planned(plan):
    return {name: container for _owner, name, container in plan}


def test_large_plain_lists_are_planned_with_the_right_container():
    ds = Paths()
    planned = _planned(ListSharing().plan(ds))
    assert set(planned) == {"paths", "items"}  # small and mixed lists are left alone
    assert isinstance(planned["paths"], SharedStrList) and planned["paths"] == ds.paths
    assert isinstance(planned["items"], SharedList) and planned["items"] == ds.meta.items
    bytes_ds = Holder([b"x%d" % i for i in range(MIN_ITEMS)])
    assert isinstance(_planned(ListSharing().plan(bytes_ds))["items"], SharedBytesList)


def test_container_is_kept_until_the_list_changes():
    ds, sharing = Paths(), ListSharing()
    first = _planned(sharing.plan(ds))["paths"]
    assert _planned(sharing.plan(ds))["paths"] is first  # unchanged: reused
    ds.paths[5] = "/changed.jpg"
    second = _planned(sharing.plan(ds))["paths"]
    assert second is not first and second[5] == "/changed.jpg"
    ds.paths.append("/new.jpg")
    third = _planned(sharing.plan(ds))["paths"]
    assert len(third) == MIN_ITEMS + 1 and third[-1] == "/new.jpg"
    ds.paths = list(ds.paths)  # a new, equal list object
    assert _planned(sharing.plan(ds))["paths"] == ds.paths


def test_opting_out_keeps_plain_lists():
    ds = Paths()
    ds.stoker_share_lists = False
    assert ListSharing().plan(ds) == ()


def test_applying_a_plan_swaps_the_attribute_and_the_container_is_read_only():
    ds = Paths()
    original = ds.paths
    apply_in_worker(ListSharing().plan(ds))
    assert type(ds.paths) is SharedStrList and ds.paths == original
    assert ds.paths[-1] == original[-1] and ds.paths[10:12] == original[10:12]
    with pytest.raises(TypeError, match="stoker_share_lists = False"):
        ds.paths[0] = "x"
