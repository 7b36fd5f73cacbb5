"""Taint reconciler: every pool node carries its pool's taint, no other node carries an owned one.

Level-based: desired taints from the cached nodes and the policy (`plan_taints`), diff with the
cached taints, write the difference (the nodes that differ, by pool: the gauge `taint_drift_nodes`).
Safe to repeat; taints with keys egress-placer does not own are
never touched (a conflicting write is rebased on the node's fresh taints). With a cursor
(controller.changes), a pass plans again only the nodes that changed since the last one and those
whose taints still differed then (a write in flight or refused); a full pass now and then.

With no valid policy in force (none loaded and none stored: `state.policy_in_force` False) it plans
nothing: the taints stay and keep everyone off the pools until a valid policy says who goes where.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable, Protocol, Sequence

from loguru import logger

from controller.core.model import NodeState, Taint
from controller.changes import NodeCursor
from controller.core.policy import PlacementPolicy
from controller.taints.core import TaintChange, plan_taints
from controller.metrics import GaugeSnapshot, Metrics
from controller.runner import Pace, unpaced


class TaintWriter(Protocol):
    def set_node_taints(
        self,
        node: str,
        taints: Sequence[Taint],
        resource_version: str | None,
        *,
        rebase: Callable[[tuple[Taint, ...]], Sequence[Taint]] | None = None,
    ) -> None: ...


class NodeSource(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    @property
    def policy_in_force(self) -> bool: ...

    def node_list(self) -> list[NodeState]: ...

    def node(self, name: str) -> NodeState | None: ...

    def node_resource_version(self, name: str) -> str | None: ...


class PoolErrorSink(Protocol):
    def report(self, pool: str, message: str) -> None: ...


class TaintReconciler:
    def __init__(
        self,
        state: NodeSource,
        writer: TaintWriter,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        in_flight_seconds: float = 30.0,
        errors: PoolErrorSink | None = None,
        paced: Pace = unpaced,
        changes: NodeCursor | None = None,
    ) -> None:
        self.state = state
        self.paced = paced  # the node walks give way to admission (runner.GiveWay)
        self.changes = changes  # None: every pass plans every node
        self._drifted: set[str] = set()  # the nodes whose taints differed from the plan in the last pass
        self.writer = writer
        self.metrics = metrics
        self.errors = errors  # a taint not written is an error about its pool (the pool's status shows it)
        self.clock = clock
        self.in_flight_seconds = in_flight_seconds
        # node -> (resourceVersion we wrote against, when): until the cache moves past that version
        # (or the time runs out) the change is in flight and is not written again.
        self._in_flight: dict[str, tuple[str | None, float]] = {}
        self._drift = GaugeSnapshot(metrics.taint_drift_nodes)  # nodes with taints to change in the last pass, by pool

    def __call__(self) -> None:
        self.reconcile()  # the loop's pass: no requeue-after (the resync is soon enough)

    def reconcile(self) -> list[TaintChange]:
        """One pass; the changes written. A failed node is logged and left for the next pass."""
        if not self.state.policy_in_force:
            return []  # an empty policy stands in: planning with it would remove every pool taint
        policy = self.state.policy
        changed = self.changes.take() if self.changes is not None else None
        if changed is None:
            nodes = {n.name: n for n in self.paced(self.state.node_list())}
        else:
            nodes = {name: node for name in sorted(changed | self._drifted) if (node := self.state.node(name)) is not None}
        now = self.clock()
        # Forget writes the cache has caught up with (or that are too old to trust).
        self._in_flight = {
            n: (v, t)
            for n, (v, t) in self._in_flight.items()
            if (n in nodes or changed is not None and self.state.node(n) is not None)
            and self.state.node_resource_version(n) == v and now - t < self.in_flight_seconds
        }
        changes = plan_taints(policy, self.paced(nodes.values()))
        self._drifted = {change.node for change in changes}
        drift = Counter((change.add or change.remove)[0].value or "" for change in changes if change.add or change.remove)
        self._drift.set({(pool,): drift[pool] for pool in {p.name for p in policy.pools} | set(drift)})
        written = []
        for change in changes:
            version = self.state.node_resource_version(change.node)
            if change.node in self._in_flight:
                continue
            log = logger.bind(kind="Node", name=change.node)
            try:
                self.writer.set_node_taints(
                    change.node, change.apply(nodes[change.node].taints), version, rebase=change.apply
                )
            except Exception as e:
                log.warning("taints not written: {}", e)
                if self.errors is not None:
                    for pool in dict.fromkeys(t.value or "" for t in (*change.add, *change.remove)):
                        self.errors.report(pool, f"the taint of node {change.node} could not be written: {e}")
                continue
            self._in_flight[change.node] = (version, now)
            for taint in change.add:
                self.metrics.taint_changes.labels(pool=taint.value or "", action="add").inc()
            for taint in change.remove:
                self.metrics.taint_changes.labels(pool=taint.value or "", action="remove").inc()
            log.bind(added=[_show(t) for t in change.add], removed=[_show(t) for t in change.remove]).info(
                "node taints reconciled"
            )
            written.append(change)
        return written


def _show(taint: Taint) -> str:
    return f"{taint.key}={taint.value or ''}:{taint.effect}"
