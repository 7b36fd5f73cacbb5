"""Intruder reconciler: pods on pool nodes whose namespace may not use the pool.

`evict` mode: evict each (policy/v1 Eviction, PodDisruptionBudgets honoured) and emit a Warning
Event `IntruderEvicted` on the pod. A budget may defer an eviction, but not for ever: once the
evictions of a pod have been refused for `budget_grace` seconds, the pod is deleted (Warning Event
`IntruderDeleted`). A budget keeps a workload available where it may run; it does not entitle a pod
to a pool node, or any namespace that may create budgets could pin its pods there. `budget_grace`
None honours budgets for ever. `report` mode: only a Warning Event `IntruderFound`, the metric and
a log line. A pod handled once is left alone for a while (it is terminating, or it was reported):
`evict_again_after` / `report_again_after` seconds.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, Protocol

from loguru import logger

from controller.core.intruders import Intruder, find_intruders
from controller.core.model import DaemonSetState, NamespaceState, NodeState, PodState
from controller.core.policy import PlacementPolicy
from controller.event_sink import EventSink
from controller.metrics import Metrics


class Evictor(Protocol):
    def evict(self, namespace: str, name: str, uid: str = "") -> bool: ...

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> None: ...


class PodSource(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    def node_list(self) -> list[NodeState]: ...

    def namespace_map(self) -> dict[str, NamespaceState]: ...

    def daemonset_map(self) -> dict[str, DaemonSetState]: ...

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
        budget_grace: float | None = 30.0,
        retry_seconds: float = 5.0,
    ) -> None:
        self.state = state
        self.evictor = evictor
        self.events = events
        self.metrics = metrics
        self.mode = mode
        self.clock = clock
        self.evict_again_after = evict_again_after
        self.report_again_after = report_again_after
        self.budget_grace = budget_grace
        self.retry_seconds = retry_seconds
        self._unfinished = False  # an intruder of the last pass was neither evicted nor reported
        self._handled: dict[tuple[str, str], float] = {}  # pod -> when it was evicted or reported
        self._refused_since: dict[tuple[str, str], float] = {}  # pod -> first eviction a budget refused

    def __call__(self) -> list[Intruder]:
        return self.reconcile()

    def next_pass_within(self) -> float | None:
        """Seconds within which the loop should run again: soon while an eviction is deferred or failed."""
        return self.retry_seconds if self._unfinished else None

    def find(self) -> list[Intruder]:
        """The intruders in the cache now (pods on nodes that belong to a pool, or that a pool names)."""
        policy = self.state.policy
        nodes = {n.name: n for n in self.state.node_list()}
        pool_nodes = {name for name, n in nodes.items() if policy.pool_of(n) is not None}
        pool_nodes.update(name for pool in policy.pools for name in pool.nodes)
        pods = [pod for node in sorted(pool_nodes) for pod in self.state.pods_on(node)]
        return find_intruders(policy, nodes, pods, self.state.namespace_map(), self.state.daemonset_map())

    def reconcile(self) -> list[Intruder]:
        """One pass; the intruders acted on (evicted or reported) in this pass."""
        now = self.clock()
        window = self.evict_again_after if self.mode == "evict" else self.report_again_after
        self._handled = {k: t for k, t in self._handled.items() if now - t < window}
        acted = []
        self._unfinished = False
        intruders = self.find()
        present = {(i.namespace, i.name) for i in intruders}
        self._refused_since = {k: t for k, t in self._refused_since.items() if k in present}
        for intruder in intruders:
            key = (intruder.namespace, intruder.name)
            if key in self._handled:
                continue
            if self._act(intruder, now):
                self._handled[key] = now
                self._refused_since.pop(key, None)
                acted.append(intruder)
            else:
                self._unfinished = True
        return acted

    def _act(self, intruder: Intruder, now: float) -> bool:
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
            evicted = self.evictor.evict(intruder.namespace, intruder.name, intruder.uid)
        except Exception as e:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="failed").inc()
            log.warning("intruder not evicted: {}", e)
            return False
        if not evicted:
            refused_since = self._refused_since.setdefault((intruder.namespace, intruder.name), now)
            if self.budget_grace is None or now - refused_since < self.budget_grace:
                self.metrics.evictions.labels(pool=intruder.pool, outcome="deferred").inc()
                log.info("intruder eviction deferred: a PodDisruptionBudget does not allow it now")
                return False
            return self._delete(intruder, now - refused_since, regarding, log)
        self.metrics.evictions.labels(pool=intruder.pool, outcome="evicted").inc()
        self.events.emit(regarding, "Warning", "IntruderEvicted", intruder.reason, action="Evict")
        log.warning("intruder evicted: {}", intruder.reason)
        return True

    def _delete(self, intruder: Intruder, refused_for: float, regarding: dict[str, Any], log: Any) -> bool:
        """Delete an intruder whose evictions its disruption budget has refused for the whole grace."""
        try:
            self.evictor.delete_pod(intruder.namespace, intruder.name, intruder.uid)
        except Exception as e:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="failed").inc()
            log.warning("intruder not deleted: {}", e)
            return False
        note = f"{intruder.reason}; its evictions were refused by a PodDisruptionBudget for {refused_for:.0f} s"
        self.metrics.evictions.labels(pool=intruder.pool, outcome="deleted").inc()
        self.events.emit(regarding, "Warning", "IntruderDeleted", note, action="Delete")
        log.warning("intruder deleted: {}", note)
        return True
