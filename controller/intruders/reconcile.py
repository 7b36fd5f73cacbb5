"""Intruder reconciler: pods on pool nodes whose namespace may not use the pool, until they are gone.

Evicted means gone. In `evict` mode each intruder is tracked by uid (a pod re-created under the same
name is another intruder at once) from the pass that finds it until the pass that no longer sees it,
through these steps:

1. **evict** (policy/v1 Eviction, PodDisruptionBudgets honoured) with a grace of at most
   `eviction_grace` seconds (the pod's own, which the tenant chooses, may be a day): Warning Event
   `IntruderEvicted`. A pod already terminating (its owner or the tenant deleted it with a long grace)
   is evicted too: the API server only ever shortens a deletion's grace.
2. **delete after grace**: still there when that grace is over (and GRACE_SETTLE_SECONDS) (a process that ignores SIGTERM on a
   node that does not kill it, a node that does not answer): deleted with grace 0 and the uid as
   precondition, Warning Event `IntruderDeletedAfterGrace`; deleted again every `retry_seconds`
   while it is still listed.
3. **delete past budget grace**: a PodDisruptionBudget may defer an eviction, but not for ever: once
   the evictions of a pod have been refused for `budget_grace` seconds it is deleted with the same
   capped grace (Warning Event `IntruderDeletedPastBudgetGrace`), then step 2 applies. A budget keeps
   a workload available where it may run; it does not entitle a pod to a pool node. `budget_grace`
   None honours budgets for ever.

When the pod is gone, the step that removed it is counted (`intruders_removed{step}`), the time from
finding it to its being gone observed (`intruder_clear_seconds`) and said in a Normal Event
`IntruderRemoved`. `report` mode: only a Warning Event `IntruderFound`, the metric
`intruders_reported_total` and a log line, once per pod per `report_again_after` seconds. Either
way the gauge `intruders{pool}` is what the last pass found.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol

from loguru import logger

from controller.intruders.core import Intruder, eviction_grace, find_intruders
from controller.core.model import DaemonSetState, NamespaceState, NodeState, PodState
from controller.core.policy import PlacementPolicy
from controller.event_sink import EventSink
from controller.metrics import GaugeSnapshot, Metrics
from controller.changes import NodeCursor
from controller.runner import Pace, unpaced

EVICTED = "evicted"
DELETED_AFTER_GRACE = "deleted-after-grace"
DELETED_PAST_BUDGET_GRACE = "deleted-past-budget-grace"
LEFT = "left"  # gone before any step of ours took effect (deleted by its owner, or it finished)
GRACE_SETTLE_SECONDS = 1.0  # after a grace, the moment a node needs to report its containers stopped


class Evictor(Protocol):
    def evict(self, namespace: str, name: str, uid: str = "", grace_seconds: int | None = None) -> bool: ...

    def delete_pod(self, namespace: str, name: str, uid: str = "", grace_seconds: int | None = None) -> None: ...


class PodSource(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    def node_list(self) -> list[NodeState]: ...

    def node(self, name: str) -> NodeState | None: ...

    def namespace_map(self) -> dict[str, NamespaceState]: ...

    def daemonset_map(self) -> dict[str, DaemonSetState]: ...

    def pods_on(self, node: str) -> list[PodState]: ...


@dataclass
class _Tracked:
    """One intruder (one uid) from the pass that found it until the pass that no longer sees it."""

    intruder: Intruder
    found_at: float
    step: str | None = None  # the last step that took effect (EVICTED, DELETED_*), None: none yet
    due: float | None = None  # when the grace of that step is over (the next step is due)
    refused_since: float | None = None  # the first eviction a budget refused


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
        eviction_grace: int = 10,
        report_again_after: float = 600.0,
        budget_grace: float | None = 30.0,
        retry_seconds: float = 5.0,
        owner_settle_seconds: float = 5.0,
        paced: Pace = unpaced,
        changes: NodeCursor | None = None,
    ) -> None:
        self.state, self.evictor, self.events, self.metrics = state, evictor, events, metrics
        self.paced = paced  # the node and pod walks give way to admission (runner.GiveWay)
        self.changes = changes  # None: every pass looks at every pool node
        self._found: dict[str, list[Intruder]] = {}  # the intruders of the last pass, by node
        self.mode = mode
        self.clock = clock
        # How long each step may take (seconds): see the settings of the same names.
        self.eviction_grace, self.budget_grace = eviction_grace, budget_grace
        self.report_again_after, self.retry_seconds = report_again_after, retry_seconds
        self.owner_settle_seconds = owner_settle_seconds
        self._tracked: dict[str, _Tracked] = {}  # by uid
        self._reported: dict[str, float] = {}  # uid -> when it was reported (report mode)
        self._next_pass: float | None = None  # seconds within which the next pass is wanted
        self._gauge = GaugeSnapshot(metrics.intruders)  # intruders found in the last pass, by pool

    def __call__(self) -> float | None:
        """The loop's pass; its requeue-after: when a grace is over, soon while an eviction is deferred
        or failed, None when nothing is pending."""
        self.reconcile()
        return self._next_pass

    def find(self) -> list[Intruder]:
        """The intruders in the cache now (pods on nodes that belong to a pool, or that a pool names),
        terminating ones included. With a cursor, the nodes that changed since the last pass and those
        that had intruders are looked at again; the others keep what the last pass found there."""
        policy = self.state.policy
        paced = self.paced
        changed = self.changes.take() if self.changes is not None else None
        if changed is None:
            nodes = {n.name: n for n in paced(self.state.node_list())}
            look = set(nodes)
            self._found = {}
        else:
            look = changed | set(self._found)
            nodes = {name: node for name in look if (node := self.state.node(name)) is not None}
            for name in look:
                self._found.pop(name, None)
        named = {name for pool in policy.pools for name in pool.nodes}
        pool_nodes = {name for name, n in paced(nodes.items()) if policy.pool_of(n) is not None}
        pool_nodes.update(named if changed is None else named & look)
        pods = [pod for node in paced(sorted(pool_nodes)) for pod in self.state.pods_on(node)]
        for intruder in find_intruders(policy, nodes, paced(pods), self.state.namespace_map(), self.state.daemonset_map()):
            self._found.setdefault(intruder.node, []).append(intruder)
        return sorted((i for found in self._found.values() for i in found), key=lambda i: (i.namespace, i.name, i.uid))

    def reconcile(self) -> list[Intruder]:
        """One pass; the intruders a step was taken against (evicted, deleted or reported) in this pass."""
        now = self.clock()
        intruders = self.find()
        found = Counter(i.pool for i in intruders)
        self._gauge.set({(pool,): found[pool] for pool in {p.name for p in self.state.policy.pools} | set(found)})
        if self.mode == "report":
            self._next_pass = None
            return self._report(intruders, now)
        present = {i.key: i for i in intruders}
        for key in [k for k in self._tracked if k not in present]:
            self._gone(self._tracked.pop(key), now)
        acted: list[Intruder] = []
        waits: list[float] = []
        for intruder in intruders:
            tracked = self._tracked.get(intruder.key)
            if tracked is None:
                tracked = self._tracked[intruder.key] = _Tracked(intruder, found_at=now)
            tracked.intruder = intruder
            wait = self._step(tracked, now)
            if wait is None:
                acted.append(intruder)
                assert tracked.due is not None
                wait = tracked.due - now
            waits.append(max(wait, 0.01))
        self._next_pass = min(waits) if waits else None
        return acted

    # -- the steps ------------------------------------------------------------------------------------

    def _step(self, tracked: _Tracked, now: float) -> float | None:
        """Take the step that is due for `tracked`: None when one was taken, else the seconds until the
        next one is due (0: nothing to wait for)."""
        intruder = tracked.intruder
        if tracked.step is None:
            if intruder.unresolved_owner and now - tracked.found_at < self.owner_settle_seconds:
                return tracked.found_at + self.owner_settle_seconds - now  # the DaemonSet cache may be behind
            return self._evict(tracked, now)
        assert tracked.due is not None
        if now < tracked.due:
            return tracked.due - now
        return self._delete_now(tracked, now)

    def _evict(self, tracked: _Tracked, now: float) -> float | None:
        intruder = tracked.intruder
        grace = eviction_grace(intruder.grace_seconds, self.eviction_grace)
        log = _log(intruder)
        try:
            evicted = self.evictor.evict(intruder.namespace, intruder.name, intruder.uid, grace)
        except Exception as e:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="failed").inc()
            log.warning("intruder not evicted: {}", e)
            return self.retry_seconds
        if not evicted:
            refused_since = tracked.refused_since = tracked.refused_since if tracked.refused_since is not None else now
            if self.budget_grace is None or now - refused_since < self.budget_grace:
                self.metrics.evictions.labels(pool=intruder.pool, outcome="deferred").inc()
                log.info("intruder eviction deferred: a PodDisruptionBudget does not allow it now")
                wait = self.retry_seconds
                if self.budget_grace is not None:
                    wait = min(wait, refused_since + self.budget_grace - now)
                return max(wait, 0.01)
            return self._delete_past_budget(tracked, now, grace, now - refused_since)
        tracked.step, tracked.due = EVICTED, now + grace + GRACE_SETTLE_SECONDS
        note = f"{intruder.reason} Evicted with a grace of {grace} s (its own: {intruder.grace_seconds} s)."
        self.metrics.evictions.labels(pool=intruder.pool, outcome=EVICTED).inc()
        self.events.emit(_regarding(intruder), "Warning", "IntruderEvicted", note, action="Evict")
        log.warning("intruder evicted: {}", note)
        return None

    def _delete_past_budget(self, tracked: _Tracked, now: float, grace: int, refused_for: float) -> float | None:
        """Delete an intruder whose evictions its disruption budget has refused for the whole grace."""
        intruder = tracked.intruder
        try:
            self.evictor.delete_pod(intruder.namespace, intruder.name, intruder.uid, grace)
        except Exception as e:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="failed").inc()
            _log(intruder).warning("intruder not deleted: {}", e)
            return self.retry_seconds
        tracked.step, tracked.due = DELETED_PAST_BUDGET_GRACE, now + grace + GRACE_SETTLE_SECONDS
        note = (
            f"{intruder.reason} Its evictions were refused by a PodDisruptionBudget for {refused_for:.0f} s: "
            f"deleted with a grace of {grace} s."
        )
        self.metrics.evictions.labels(pool=intruder.pool, outcome=DELETED_PAST_BUDGET_GRACE).inc()
        self.events.emit(_regarding(intruder), "Warning", "IntruderDeletedPastBudgetGrace", note, action="Delete")
        _log(intruder).warning("intruder deleted: {}", note)
        return None

    def _delete_now(self, tracked: _Tracked, now: float) -> float | None:
        """Still there once the grace it was given is over: delete it with grace 0 (the uid as
        precondition), and again every retry_seconds while it is still listed."""
        intruder = tracked.intruder
        first = tracked.step != DELETED_AFTER_GRACE
        try:
            self.evictor.delete_pod(intruder.namespace, intruder.name, intruder.uid, 0)
        except Exception as e:
            self.metrics.evictions.labels(pool=intruder.pool, outcome="failed").inc()
            _log(intruder).warning("intruder not deleted: {}", e)
            return self.retry_seconds
        tracked.step, tracked.due = DELETED_AFTER_GRACE, now + self.retry_seconds
        if not first:
            return None
        note = f"{intruder.reason} Still there {now - tracked.found_at:.0f} s after it was found: deleted with grace 0."
        self.metrics.evictions.labels(pool=intruder.pool, outcome=DELETED_AFTER_GRACE).inc()
        self.events.emit(_regarding(intruder), "Warning", "IntruderDeletedAfterGrace", note, action="Delete")
        _log(intruder).warning("intruder deleted after its grace: {}", note)
        return None

    def _gone(self, tracked: _Tracked, now: float) -> None:
        intruder = tracked.intruder
        step = tracked.step or LEFT
        took = now - tracked.found_at
        self.metrics.intruders_removed.labels(pool=intruder.pool, step=step).inc()
        self.metrics.intruder_clear_seconds.labels(pool=intruder.pool).observe(took)
        how = "gone before any step" if step == LEFT else f"removed by: {step}"
        note = f"Pod {intruder.namespace}/{intruder.name} left node {intruder.node} of pool {intruder.pool} {took:.1f} s after it was found ({how})."
        self.events.emit(_regarding(intruder), "Normal", "IntruderRemoved", note, action="Remove")
        _log(intruder).bind(step=step, seconds=round(took, 1)).info("intruder gone: {}", note)

    # -- report mode ----------------------------------------------------------------------------------

    def _report(self, intruders: list[Intruder], now: float) -> list[Intruder]:
        self._reported = {k: t for k, t in self._reported.items() if now - t < self.report_again_after}
        acted = []
        for intruder in intruders:
            if intruder.key in self._reported:
                continue
            self._reported[intruder.key] = now
            self.metrics.intruders_reported.labels(pool=intruder.pool).inc()
            self.events.emit(_regarding(intruder), "Warning", "IntruderFound", intruder.reason, action="Report")
            _log(intruder).warning("intruder found (report mode): {}", intruder.reason)
            acted.append(intruder)
        return acted


def _regarding(intruder: Intruder) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": intruder.namespace, "name": intruder.name, "uid": intruder.uid}


def _log(intruder: Intruder) -> Any:
    return logger.bind(
        kind="Pod", namespace=intruder.namespace, name=intruder.name, uid=intruder.uid, node=intruder.node, pool=intruder.pool
    )
