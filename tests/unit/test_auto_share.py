"""NOTE [ Automatic list sharing ]: which lists are read in place, which are shared in a
container, and when a container is rebuilt."""

from __future__ import annotations

import pytest

from stoker.sharing import SharedBytesList, SharedList, SharedStrList, inherited_list
from stoker.sharing.auto_share import MIN_ITEMS, READ_IN_PLACE, ListSharing, apply_in_worker
from stoker.sharing.inherited_list import InheritedList
from stoker.sharing.stand_in import ListStandIn

in_place_readable = pytest.mark.skipif(
    not inherited_list.available(), reason="this interpreter's object layout is not read"
)


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


@in_place_readable
def test_lists_only_the_dataset_holds_are_read_in_place():
    ds = Paths()
    planned = _planned(ListSharing().plan(ds))
    assert planned == {"paths": READ_IN_PLACE, "items": READ_IN_PLACE}  # small, mixed: left
    expected = list(ds.paths)  # an equal copy: holding the list itself would count
    apply_in_worker(ListSharing().plan(ds))
    assert type(ds.paths._items) is InheritedList and ds.paths == expected
    assert type(ds.meta.items._items) is InheritedList and ds.meta.items[3] == ("/x/3", 3)
    ds.paths[0] = "x"  # the worker's own copy from now on
    assert ds.paths[:2] == ["x", expected[1]] and ds.paths._items is None


@in_place_readable
def test_aliases_of_one_list_get_one_view():
    ds = Paths()
    ds.imgs = ds.paths  # like ImageFolder's samples/imgs
    plan = ListSharing().plan(ds)
    assert _planned(plan)["imgs"] is READ_IN_PLACE
    apply_in_worker(plan)
    assert ds.imgs is ds.paths and type(ds.paths._items) is InheritedList


def test_lists_of_rich_items_are_left_alone():
    ds = Holder([{"i": i} for i in range(MIN_ITEMS)])
    assert ListSharing().plan(ds) == ()


def test_large_plain_lists_held_elsewhere_too_get_a_container():
    ds = Paths()
    elsewhere = [ds.paths, ds.meta.items]  # a reference the worker could change it through
    planned = _planned(ListSharing().plan(ds))
    assert set(planned) == {"paths", "items"}  # small and mixed lists are left alone
    assert isinstance(planned["paths"], SharedStrList) and planned["paths"] == ds.paths
    assert isinstance(planned["items"], SharedList) and planned["items"] == ds.meta.items
    blobs = [b"x%d" % i for i in range(MIN_ITEMS)]
    bytes_ds = Holder(blobs)
    assert isinstance(_planned(ListSharing().plan(bytes_ds))["items"], SharedBytesList)
    assert elsewhere


def test_container_is_kept_until_the_list_changes():
    ds, sharing = Paths(), ListSharing()
    elsewhere = [ds.paths]
    first = _planned(sharing.plan(ds))["paths"]
    assert _planned(sharing.plan(ds))["paths"] is first  # unchanged: reused
    ds.paths[5] = "/changed.jpg"
    second = _planned(sharing.plan(ds))["paths"]
    assert second is not first and second[5] == "/changed.jpg"
    ds.paths.append("/new.jpg")
    third = _planned(sharing.plan(ds))["paths"]
    assert len(third) == MIN_ITEMS + 1 and third[-1] == "/new.jpg"
    ds.paths = list(ds.paths)  # a new, equal list object
    elsewhere.append(ds.paths)
    assert _planned(sharing.plan(ds))["paths"] == ds.paths


def test_opting_out_keeps_plain_lists():
    ds = Paths()
    ds.stoker_share_lists = False
    assert ListSharing().plan(ds) == ()


def test_applying_a_plan_swaps_the_attribute_and_a_change_goes_to_a_copy_of_its_own():
    ds = Paths()
    original = ds.paths  # held here too: a container
    before = list(original)
    apply_in_worker(ListSharing().plan(ds))
    assert type(ds.paths) is ListStandIn and type(ds.paths._items) is SharedStrList
    assert ds.paths == original
    assert ds.paths[-1] == original[-1] and ds.paths[10:12] == original[10:12]
    ds.paths[0] = "x"  # as a worker's own copy of the list would change under torch
    assert ds.paths[0] == "x" and ds.paths[1:] == before[1:] and original == before
