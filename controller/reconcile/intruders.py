"""Intruder reconciler: pods on pool nodes whose namespace may not use the pool.

`evict` mode: evict each (policy/v1 Eviction, PodDisruptionBudgets honoured) and emit a Warning
Event `IntruderEvicted` on the pod. `report` mode: only a Warning Event `IntruderFound`, the
metric and a log line. A pod handled once is left alone for a while (it is terminating, or it was
reported): `evict_again_after` / `report_again_after` seconds.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, Protocol

from loguru import logger

from controller.core.intruders import Intruder, find_intruders
from controller.core.model import NamespaceState, NodeState, PodState
from controller.core.policy import PlacementPolicy
from controller.metrics import Metrics


class Evictor(Protocol):
    def evict(self, namespace: str, name: str) -> bool: ...


class EventSink(Protocol):
    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None: ...


class PodSource(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    def node_list(self) -> list[NodeState]: ...

    def namespace_map(self) -> dict[str, NamespaceState]: ...

    def pods_on(self, node: str) -> list[PodState]: ...


class IntruderReconciler:
    def __init__(
        self,
        state: PodSource,
        evictor: Evictor,
        events: EventSink,
        metrics: Metrics,
        mode: Literal["evict", "report"],
        *,
        clock: Callable[[], float] = time.monotonic,
        evict_again_after: float = 30.0,
        report_again_after: float = 600.0,
    ) -> None:
        self.state = state
        self.evictor = evictor
        self.events = events
        self.metrics = metrics
        self.mode = mode
        self.clock = clock
        self.evict_again_after = evict_again_after
        self.report_again_after = report_again_after
        self._handled: dict[tuple[str, str], float] = {}  # pod -> when it was evicted or reported

    def __call__(self) -> list[Intruder]:
        return self.reconcile()

    def find(self) -> list[Intruder]:
        """The intruders in the cache now (pods on nodes that belong to a pool, or that a pool names)."""
        policy = self.state.policy
        nodes = {n.name: n for n in self.state.node_list()}
        pool_nodes = {name for name, n in nodes.items() if policy.pool_of(n) is not None}
        pool_nodes.update(name for pool in policy.pools for name in pool.nodes)
        pods = [pod for node in sorted(pool_nodes) for pod in self.state.pods_on(node)]
        return find_intruders(policy, nodes, pods, self.state.namespace_map())

    def reconcile(self) -> list[Intruder]:
        """One pass; the intruders acted on (evicted or reported) in this pass."""
        now = self.clock()
        window = self.evict_again_after if self.mode == "evict" else self.report_again_after
        self._handled = {k: t for k, t in self._handled.items() if now - t < window}
        acted = []
        for intruder in self.find():
            key = (intruder.namespace, intruder.name)
            if key in self._handled:
                continue
            if self._act(intruder):
                self._handled[key] = now
                acted.append(intruder)
        return acted

    def _act(self, intruder: Intruder) -> bool:
        log = logger.bind(
            kind="Pod", namespace=intruder.namespace, name=intruder.name, node=intruder.node, pool=intruder.pool
        )
        regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": intruder.namespace, "name": intruder.name}
        if self.mode == "report":
            self.metrics.evictions.labels(pool=intruder.pool, outcome="reported").inc()
            self.events.emit(regarding, "Warning", "IntruderFound", intruder.reason, action="Report")
            log.warning("intruder found (report mode): {}", intruder.reason)
            return True
        try:
            evicted = self.evictor.evict(intruder.namespace, intruder.name)
        except Exception as e:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="failed").inc()
            log.warning("intruder not evicted: {}", e)
            return False
        if not evicted:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="deferred").inc()
            log.info("intruder eviction deferred: a PodDisruptionBudget does not allow it now")
            return False
        self.metrics.evictions.labels(pool=intruder.pool, outcome="evicted").inc()
        self.events.emit(regarding, "Warning", "IntruderEvicted", intruder.reason, action="Evict")
        log.warning("intruder evicted: {}", intruder.reason)
        return True
