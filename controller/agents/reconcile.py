"""Agent reconciler: node agents (DaemonSets of agent namespaces) kept off pool nodes by a pool taint
their pod template does not tolerate.

New templates get the pool tolerations at admission (admission.daemonset). A DaemonSet that was
there before the install or a policy change (or was written while the webhook was down) is the
leader's: changing its template restarts every pod of it, so by default it is only reported:

- a Warning Event `AgentMissingOnPool` on the DaemonSet (again when what is missing changes, or after
  `report_again_after` seconds), the gauge `agent_pool_nodes_missing{namespace, daemonset}`, and
  `egress-placer status`;
- where its owner opted in (annotation `egress-placer.io/pool-tolerations: patch` on it, or the
  policy's `patchExistingAgents`), its template gets the missing tolerations (kube adapter, on the
  fresh object, resourceVersion as precondition), recorded in the annotation
  `egress-placer.io/pool-tolerations-added` and a Normal Event `PoolTolerationsAdded`.

Level-based: the plan comes from the caches each pass (agents.core.plan_agents); a patched template
drops out of the plan once the cache has it (until then, for `in_flight_seconds`, it is not patched
again). With a cursor (controller.changes), each pool node's part of the plan (agents.core.node_agents)
is kept and worked out again only when the node or its pods changed; a DaemonSet, a namespace or the
policy changing makes the next pass a full one.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol

from loguru import logger

from controller.agents.core import (
    TOLERATIONS_ADDED_ANNOTATION,
    POOL_TOLERATIONS_ANNOTATION,
    AgentGap,
    NodeAgents,
    added_record,
    agent_gaps,
    agent_tolerations,
    candidate_agents,
    node_agents,
    plan_agents,
    show_toleration,
)
from controller.changes import NodeCursor
from controller.core.model import DaemonSetState, NodeState, PodState
from controller.core.policy import PlacementPolicy
from controller.event_sink import EventSink
from controller.metrics import GaugeSnapshot, Metrics
from controller.runner import Pace, unpaced


class AgentWriter(Protocol):
    def set_daemonset_tolerations(
        self,
        namespace: str,
        name: str,
        uid: str,
        rebase: Callable[[list[Any]], list[Any]],
        annotations: Mapping[str, str],
    ) -> list[Any] | None: ...


class AgentSource(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    def node_list(self) -> list[NodeState]: ...

    def node(self, name: str) -> NodeState | None: ...

    def daemonset_map(self) -> dict[str, DaemonSetState]: ...

    def pods_on(self, node: str) -> list[PodState]: ...


def find_gaps(state: AgentSource, paced: Pace = unpaced) -> list[AgentGap]:
    """The plan from the caches: node agents kept off pool nodes by an untolerated pool taint. `paced`:
    how the nodes and pods are walked (the leader's pass gives way to admission: runner.GiveWay)."""
    policy = state.policy
    nodes = state.node_list()
    pods = [pod for node in paced(nodes) if policy.pool_of(node) is not None for pod in state.pods_on(node.name)]
    return plan_agents(policy, paced(nodes), state.daemonset_map(), paced(pods))


class AgentReconciler:
    def __init__(
        self,
        state: AgentSource,
        writer: AgentWriter,
        events: EventSink,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        report_again_after: float = 600.0,
        in_flight_seconds: float = 30.0,
        paced: Pace = unpaced,
        changes: NodeCursor | None = None,
    ) -> None:
        self.state = state
        self.paced = paced  # the node and pod walks give way to admission (runner.GiveWay)
        self.changes = changes  # None: every pass plans from every pool node
        self._parts: dict[str, NodeAgents] = {}  # each pool node's part of the plan (with a cursor)
        self._gaps: list[AgentGap] | None = None  # the plan of the last pass (with a cursor)
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.report_again_after = report_again_after
        self.in_flight_seconds = in_flight_seconds
        self._reported: dict[str, tuple[tuple[str, ...], float]] = {}  # uid -> (missing nodes said, when)
        self._in_flight: dict[str, float] = {}  # uid -> when its template was patched
        self._gauge = GaugeSnapshot(metrics.agents_missing)

    def __call__(self) -> None:
        self.reconcile()  # the loop's pass: no requeue-after (the resync is soon enough)

    def reconcile(self) -> list[AgentGap]:
        """One pass; the gaps acted on (reported or patched) in it."""
        now = self.clock()
        policy = self.state.policy
        gaps = self.find()
        present = {g.uid for g in gaps}
        self._in_flight = {u: t for u, t in self._in_flight.items() if u in present and now - t < self.in_flight_seconds}
        self._reported = {u: r for u, r in self._reported.items() if u in present}
        self._gauge.set({(g.namespace, g.name): len(g.missing) for g in gaps})
        acted = []
        for gap in gaps:
            if gap.patch:
                if gap.uid not in self._in_flight and self._patch(gap, policy, now):
                    acted.append(gap)
            elif gap.missing and self._report(gap, now):
                acted.append(gap)
        return acted

    def find(self) -> list[AgentGap]:
        """The plan now: `find_gaps`; with a cursor, from each pool node's part, worked out again for the
        nodes that changed since the last pass (every node on a full pass)."""
        if self.changes is None:
            return find_gaps(self.state, self.paced)
        changed = self.changes.take()
        if changed is not None and not changed and self._gaps is not None:
            return self._gaps
        policy, daemonsets = self.state.policy, self.state.daemonset_map()
        candidates = candidate_agents(policy, daemonsets)
        if changed is None:
            self._parts, self._gaps = {}, None
            nodes = [(node.name, node) for node in self.state.node_list()]
        else:
            nodes = [(name, self.state.node(name)) for name in sorted(changed)]
        moved = False
        for name, node in self.paced(nodes):
            pool = policy.pool_of(node) if node is not None else None
            part = node_agents(policy, node, pool, candidates, daemonsets, self.state.pods_on(name)) if node is not None and pool is not None else None
            if part is None:
                moved |= self._parts.pop(name, None) is not None
            elif self._parts.get(name) != part:
                self._parts[name], moved = part, True
        if moved or self._gaps is None:
            self._gaps = agent_gaps(policy, candidates, self._parts)
        return self._gaps

    def _report(self, gap: AgentGap, now: float, failure: str = "") -> bool:
        said = self._reported.get(gap.uid)
        if said is not None and said[0] == gap.missing and now - said[1] < self.report_again_after:
            return False
        self._reported[gap.uid] = (gap.missing, now)
        shown = ", ".join(show_toleration(t) for t in gap.add)
        note = (
            f"No pod on {len(gap.missing)} of the {len(gap.nodes)} pool nodes it targets ({_nodes(gap.missing)}): "
            f"its pod template does not tolerate the taint of pool {', '.join(gap.pools)}."
        )
        if failure:
            note += failure
        else:
            note += (
                f" Left as it is (changing the template restarts every pod): add the tolerations ({shown}) to its "
                f"manifest, or opt in with the annotation {POOL_TOLERATIONS_ANNOTATION}=patch or the policy's "
                "patchExistingAgents."
            )
        self.events.emit(_regarding(gap), "Warning", "AgentMissingOnPool", note, action="Report")
        _log(gap).warning("node agent missing on pool nodes: {}", note)
        return True

    def _patch(self, gap: AgentGap, policy: PlacementPolicy, now: float) -> bool:
        log = _log(gap)
        before: list[Any] = []

        def rebase(current: list[Any]) -> list[Any]:
            before[:] = current
            return agent_tolerations(current, policy)

        record = added_record(gap.add, "leader", gap.why)
        try:
            written = self.writer.set_daemonset_tolerations(
                gap.namespace, gap.name, gap.uid, rebase, {TOLERATIONS_ADDED_ANNOTATION: record}
            )
        except Exception as e:  # forbidden (no rbac-agents Role in its namespace), refused, API down
            log.warning("pod template not patched: {}", e)
            self._report(gap, now, f" Opted in ({gap.why}), but the patch failed: {e}")
            return False
        self._in_flight[gap.uid] = now
        if written is None:  # the owner added them meanwhile, or it is gone: the next pass sees it
            return False
        added = [t for t in written if t not in before]
        shown = ", ".join(show_toleration(t) for t in added)
        note = (
            f"Existing pod template given the pool tolerations ({shown}; opted in: {gap.why}), so it runs on the "
            f"{len(gap.nodes)} pool nodes it targets ({_nodes(gap.nodes)}). Its pods restart as its updateStrategy says."
        )
        self.metrics.agent_tolerations_added.labels(by="leader").inc()
        self.events.emit(_regarding(gap), "Normal", "PoolTolerationsAdded", note, action="Patch")
        log.info("node agent's pod template patched: {}", note)
        return True


def _nodes(names: tuple[str, ...], shown: int = 10) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _regarding(gap: AgentGap) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "namespace": gap.namespace, "name": gap.name, "uid": gap.uid}


def _log(gap: AgentGap) -> Any:
    return logger.bind(kind="DaemonSet", namespace=gap.namespace, name=gap.name, uid=gap.uid, pools=list(gap.pools))
