"""Which nodes changed since a reconciler last looked (#24): its pass looks again at those nodes only.

A reconciler that reads every pool node (taints, intruders, node agents) keeps its answer per node
and, in a pass, works out again only the nodes whose object or pods changed since its previous pass
(and those whose answer was not empty: a write to retry, an intruder whose grace runs), as a
controller-runtime reconciler is queued per object. A change that can move every node's answer (the
policy, a namespace, a DaemonSet, a relist) makes the next pass of every reconciler a full one; so do
the first pass and one every `full_every` seconds, the resync that catches what an event could not
(controller-runtime's SyncPeriod).

`NodeChanges` is fed by `ClusterState` on the informers' threads (`nodes`, `everything`); each
reconciler holds a `NodeCursor` (`NodeChanges.cursor()`), and `take()` at the start of a pass gives
the nodes to look at again, or None for all of them. A cursor that is not taken (a replica that does
not lead) holds at most `most` names, then asks for a full pass instead.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

FULL_EVERY_SECONDS = 600.0
MOST_NAMES = 20_000


class NodeCursor:
    """One reconciler's place: the nodes changed since its last `take()` (module docstring)."""

    def __init__(self, lock: threading.Lock, clock: Callable[[], float], full_every: float, most: int) -> None:
        self._lock, self.clock, self.full_every, self.most = lock, clock, full_every, most
        self._changed: set[str] = set()
        self._full = True  # the first pass sees every node
        self._full_at: float | None = None

    def _mark(self, names: tuple[str | None, ...]) -> None:  # under the lock
        if self._full:
            return
        self._changed.update(name for name in names if name)
        if len(self._changed) > self.most:
            self._everything()

    def _everything(self) -> None:  # under the lock
        self._full = True
        self._changed = set()

    def take(self) -> set[str] | None:
        """The nodes changed since the last call, or None when the pass must look at every node."""
        now = self.clock()
        with self._lock:
            changed, full = self._changed, self._full
            if self._full_at is not None and now - self._full_at >= self.full_every:
                full = True
            self._changed, self._full = set(), False
        if full:
            self._full_at = now
            return None
        return changed


class NodeChanges:
    """The feed of node changes for every reconciler's cursor (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, full_every: float = FULL_EVERY_SECONDS,
                 most: int = MOST_NAMES) -> None:
        self.clock, self.full_every, self.most = clock, full_every, most
        self._lock = threading.Lock()
        self._cursors: list[NodeCursor] = []

    def cursor(self) -> NodeCursor:
        cursor = NodeCursor(self._lock, self.clock, self.full_every, self.most)
        with self._lock:
            self._cursors.append(cursor)
        return cursor

    def nodes(self, *names: str | None) -> None:
        """These nodes changed: the node itself, or a pod that is or was on it (None: no node)."""
        with self._lock:
            for cursor in self._cursors:
                cursor._mark(names)  # noqa: SLF001 - the cursor's own feed

    def everything(self) -> None:
        """A change that can move any node's answer: every cursor's next pass is a full one."""
        with self._lock:
            for cursor in self._cursors:
                cursor._everything()  # noqa: SLF001
