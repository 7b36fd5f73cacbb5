"""The placement log: the pods of TaskRuns bound to a pool node, created within the last hour (uid,
node, creation time). An informer observer on pods: every replica keeps it, so a new leader counts as
the old one did; a replica that restarts counts only the pods that still exist (it lists them).

A pod counts only when it is a run's pod (`queue.core.is_run_pod`: its controller owner resolves by uid to
a cached TaskRun carrying our decision, whose status.podName, once set, names it), never by its
`tekton.dev/taskRun` label, which its creator writes: a tenant's labelled pods do not inflate
`runsPlacedLastHour`. A pod seen before its TaskRun is cached is looked at again on its next event."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Mapping, Protocol

from controller.core.model import NodeState, OwnerRef, owner_refs
from controller.core.policy import PlacementPolicy
from controller.placement_log.core import PLACEMENT_WINDOW_SECONDS, Placed, parse_rfc3339

MAX_PLACEMENTS = 100_000  # runs' pods remembered at most (the oldest are forgotten first)


class PlacementState(Protocol):
    """What the log reads of the state: which nodes are in a pool."""

    @property
    def policy(self) -> PlacementPolicy: ...

    def node(self, name: str) -> NodeState | None: ...

    @property
    def queue(self) -> "RunPods": ...


class RunPods(Protocol):
    """Which pods are runs' pods (queue.view.QueueView)."""

    def is_run_pod(self, namespace: str, owners: tuple[OwnerRef, ...], name: str) -> bool: ...


class PlacementLog:
    """An informer observer (`ObjectObserver`) of pods: the runs' pods bound to a pool node, created
    within `window` seconds of `clock()`."""

    def __init__(
        self, state: PlacementState, *, clock: Callable[[], float] = time.time, window: float = PLACEMENT_WINDOW_SECONDS
    ) -> None:
        self.state = state
        self.clock = clock
        self.window = window
        self._placed: OrderedDict[str, Placed] = OrderedDict()  # by pod uid
        self._lock = threading.Lock()

    def replace(self, kind: str, objs: list[dict[str, Any]]) -> None:
        if kind == "Pod":
            for obj in objs:
                self._see(obj)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if kind == "Pod" and event != "DELETED":
            self._see(obj)

    def _see(self, pod: Mapping[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not node or not uid or uid in self._placed:
            return
        created = parse_rfc3339(meta.get("creationTimestamp"))
        if created is None or self.clock() - created > self.window:
            return
        if self.state.policy.pool_of(self.state.node(node) or NodeState(name=node)) is None:
            return
        if not self.state.queue.is_run_pod(meta.get("namespace") or "default", owner_refs(meta), meta.get("name") or ""):
            return
        with self._lock:
            self._placed[uid] = Placed(node, created)
            while len(self._placed) > MAX_PLACEMENTS:
                self._placed.popitem(last=False)

    def placed(self) -> list[Placed]:
        """The runs' pods placed within the window (older ones are forgotten now)."""
        since = self.clock() - self.window
        with self._lock:
            for uid in [u for u, p in self._placed.items() if p.at <= since]:
                del self._placed[uid]
            return list(self._placed.values())
