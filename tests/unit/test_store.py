"""controller.store.Store: events and relists give the same snapshot, indexes follow their items, and a
snapshot a reader holds never changes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.store import Store


def pod(name: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node}}


def store() -> Store[str, tuple[str, str | None]]:
    return Store(lambda o: o["metadata"]["name"], lambda o: (o["metadata"]["name"], o["spec"]["nodeName"]),
                 {"node": lambda value: value[1]})


def plain(s: Store[Any, Any]) -> tuple[dict[Any, Any], dict[Any, dict[Any, Any]]]:
    return dict(s.items), {at: dict(group) for at, group in s.snapshot.indexes["node"].items()}


def test_an_item_moves_between_index_entries_and_leaves_them_when_deleted():
    s = store()
    s.apply(pod("a", "n1"), False)
    s.apply(pod("a", "n2"), False)
    assert plain(s) == ({"a": ("a", "n2")}, {"n2": {"a": ("a", "n2")}})
    old, new = s.apply(pod("a", "n2"), True)
    assert (old, new) == (("a", "n2"), None) and plain(s) == ({}, {})
    assert s.apply(pod("b", None), True) == (None, None)


def test_a_snapshot_held_by_a_reader_does_not_change():
    s = store()
    s.apply(pod("a", "n1"), False)
    held = s.snapshot
    s.apply(pod("a", "n2"), False)
    s.snapshot = s.build([pod("c", "n3")])
    assert dict(held.items) == {"a": ("a", "n1")} and dict(held.under("node", "n1")) == {"a": ("a", "n1")}
    assert dict(held.under("node", "n2")) == {}


events = st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([None, "n1", "n2"]), st.booleans()), max_size=30)


@given(events)
def test_events_and_a_relist_of_what_they_left_give_the_same_snapshot(steps):
    s = store()
    for name, node, deleted in steps:
        s.apply(pod(name, node), deleted)
    relisted = store()
    relisted.snapshot = relisted.build(pod(name, node) for name, (_, node) in s.items.items())
    assert plain(s) == plain(relisted)
