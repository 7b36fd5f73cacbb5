"""Bounded memos of the pure steps admission repeats for every review: most reviews of a burst are
the same Task's runs and pods, so image discovery, `decide` and the placed template give the same
answers again and again (controller/admission/handlers.py).

A memo answers by key; the key must name everything the step reads but the few large objects it
reads whole (the policy, Tekton's objects and their generation, Tekton's default pod template):
those are the memo's `scope`, compared by identity, and a call with another scope empties it first
(the memo holds the scope, so no id is ever reused while it counts). Past `size` entries the oldest
goes. Safe for the event loop and the large-review thread at once: the lock is held only around the
table, never while the step runs, and an answer computed under a scope replaced meanwhile is not kept.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import orjson

V = TypeVar("V")

# Keys carry JSON text (`json_key`) up to this many bytes; a larger piece of a review is not memoised
# (its step runs as without a memo). A tenant sending ever new pieces costs at most about
# size x MAX_KEY_BYTES per memo for the keys, as much again for templates: 8 MiB at 1,024 entries.
# A catalog run's taskRef and params, or a pod's tolerations and affinity, are well under 1 KiB.
MAX_KEY_BYTES = 4 * 1024


class Memo(Generic[V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[Hashable, V] = {}
        self._scope: tuple[object, ...] = ()
        self._lock = threading.Lock()

    def get(self, key: Hashable | None, compute: Callable[[], V], scope: tuple[object, ...] = ()) -> V:
        """`compute()`, or what it gave before for `key` under the same `scope`. A None key: not memoised."""
        if key is None:
            return compute()
        with self._lock:
            if not _same(scope, self._scope):
                self._entries.clear()
                self._scope = scope
            try:
                return self._entries[key]
            except KeyError:
                pass
        value = compute()
        with self._lock:
            if _same(scope, self._scope):
                if len(self._entries) >= self.size:
                    del self._entries[next(iter(self._entries))]
                self._entries[key] = value
        return value

    def __len__(self) -> int:
        return len(self._entries)


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))


def json_key(value: object) -> bytes | None:
    """Exact JSON text of `value` for a memo key (1, 1.0 and true differ; members in their order),
    or None when it is over MAX_KEY_BYTES or not plain JSON orjson writes exactly (orjson writes NaN
    and infinities as null, which the standard library's decoding of a body may have let in)."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None
    if len(text) > MAX_KEY_BYTES or (b"null" in text and orjson.loads(text) != value):
        return None
    return text
