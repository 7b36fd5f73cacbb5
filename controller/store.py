"""One store per resource: its objects, each reduced to what readers need, by key, with indexes.

A `Store` holds one immutable `Snapshot` (immutables.Map, a hash array mapped trie: an update is
O(log n) and shares the rest; a snapshot is one reference). Readers take `store.snapshot` and read it
with no lock, as long as they like. One writer at a time (the resource's informer thread, or its
caller's lock): `apply` makes the next snapshot from the last, `build` makes a whole one off to the
side (a relist; no lock needed), published by assigning `store.snapshot`: one step.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Iterable, Mapping, TypeVar

from immutables import Map

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
EMPTY: Map[Any, Any] = Map()
RELEASE_STEP = 500  # items of a replaced snapshot freed at a time (500 pods: ~0.5 ms)


@dataclass(frozen=True)
class Snapshot(Generic[K, V]):
    """The items by key and the indexes, as of one moment."""

    items: Map[K, V]
    indexes: Mapping[str, Map[Hashable, Map[K, V]]]  # index name -> index value -> the items under it

    def under(self, index: str, value: Hashable) -> Map[K, V]:
        return self.indexes[index].get(value, EMPTY)


class Store(Generic[K, V]):
    """`key(obj)` names an object; `value(obj)` is what is kept of it (None: nothing, as if deleted);
    `indexes[name](value)` is the index value an item is found under (None: not indexed)."""

    def __init__(self, key: Callable[[Mapping[str, Any]], K], value: Callable[[Mapping[str, Any]], V | None],
                 indexes: Mapping[str, Callable[[V], Hashable | None]] | None = None) -> None:
        self.key = key
        self.value = value
        self.index_of = dict(indexes or {})
        self.snapshot: Snapshot[K, V] = Snapshot(EMPTY, {name: EMPTY for name in self.index_of})

    def apply(self, obj: Mapping[str, Any], deleted: bool) -> tuple[V | None, V | None]:
        """One watch event; returns (old, new) value (None: absent)."""
        key = self.key(obj)
        new = None if deleted else self.value(obj)
        snap = self.snapshot
        old = snap.items.get(key)
        if old is None and new is None:
            return None, None
        items = snap.items.delete(key) if new is None else snap.items.set(key, new)
        indexes = dict(snap.indexes)
        for name, index_of in self.index_of.items():
            before, after = (None if old is None else index_of(old)), (None if new is None else index_of(new))
            index = indexes[name]
            if before is not None and (before != after or new is None):
                rest = index.get(before, EMPTY).delete(key)
                index = index.set(before, rest) if rest else index.delete(before)
            if after is not None:
                index = index.set(after, index.get(after, EMPTY).set(key, new))
            indexes[name] = index
        self.snapshot = Snapshot(items, indexes)
        return old, new

    def build(self, objs: Iterable[Mapping[str, Any]]) -> Snapshot[K, V]:
        """The snapshot of exactly `objs` (a relist), made off to the side: nothing is published."""
        items = {self.key(obj): value for obj in objs if (value := self.value(obj)) is not None}
        indexes = {}
        for name, index_of in self.index_of.items():
            groups: dict[Hashable, dict[K, V]] = {}
            for key, value in items.items():
                at = index_of(value)
                if at is not None:
                    groups.setdefault(at, {})[key] = value
            indexes[name] = _map((at, _map(group.items())) for at, group in groups.items())
        return Snapshot(_map(items.items()), indexes)

    @property
    def items(self) -> Map[K, V]:
        return self.snapshot.items


def _map(pairs: Iterable[tuple[Any, Any]]) -> Map[Any, Any]:
    """A Map built one item at a time: between items the interpreter may switch threads (the event
    loop answers reviews meanwhile), where `Map(dict)` of 20,000 items holds it for ~16 ms."""
    with EMPTY.mutate() as building:
        for key, value in pairs:
            building[key] = value
        return building.finish()


def release(retired: list[Any], freeze: bool = True) -> None:
    """Free the items of a replaced snapshot a step at a time (20,000 pods freed at once hold the
    interpreter ~20 ms; between steps the event loop answers reviews; so too a relist's listed objects
    and its claims once read: `freeze` False), then move what the relist
    built out of the collector's generations (gc.freeze): a young collection that scans the new
    snapshot's 300,000 objects holds the interpreter ~50 ms. Frozen objects are still freed by
    reference counting when the next relist replaces them; cyclic garbage that other threads left in
    the young generations at that moment is frozen too (a few thousand objects at most: the young
    generation's threshold, controller.app.tune_interpreter)."""
    while retired:
        del retired[-RELEASE_STEP:]
    if freeze:
        gc.freeze()
