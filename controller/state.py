"""The controller's in-memory picture of the cluster: what admission reads and reconcilers act on.

Informers feed it (`apply` and `replace`); the admission handlers and reconcilers read it. It makes
no API call. Every method is thread-safe: informers run in threads, admission in the event loop.
Only the fields the core needs are kept (NodeState, NamespaceState, PodState, the TektonObjects
index, run names), so memory stays small on big clusters and does not grow with what tenants write
(the informers keep only the labels and annotations some reader looks up: kube.informer.KEPT_LABELS,
KEPT_ANNOTATIONS). Finished pods (Succeeded, Failed) are not kept: they hold no node.

`subscribe(callback)` tells the reconcile loop that something it acts on changed: nodes,
namespaces, the policy, Tekton's coschedule flag, DaemonSets coming and going (they decide which pods
are node agents), and pods on pool nodes (other pods do not wake it).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from loguru import logger

from controller.core.balance import LoadLedger, choose_node, eligible_nodes, ledger_key
from controller.core.egress import Measurement, RatioFigure, rank_nodes
from controller.core.images import TASKRUN_LABEL, TektonObjects
from controller.core.model import (
    DECISION_ANNOTATION,
    DaemonSetState,
    NamespaceState,
    NodeLoad,
    NodeState,
    PodState,
)
from controller.core.policy import PlacementPolicy, Pool

RUN_KINDS = ("TaskRun", "PipelineRun")
POLICY = "Policy"  # the kind passed to subscribers when the policy changes
TEKTON_FLAGS = "TektonFeatureFlags"  # ... and when Tekton's coschedule flag changes

PodKey = tuple[str, str]
RunKey = tuple[str, str, str]  # kind, namespace, name


class ClusterState:
    def __init__(
        self,
        policy: PlacementPolicy | None,
        clock: Callable[[], float],
        assumption_ttl: float = 60.0,
        balance: str = "load",
    ) -> None:
        """`policy` None: no valid policy in force yet (`policy` is then the empty one: nothing is
        placed, and `policy_in_force` is False so the taint reconciler leaves the taints alone)."""
        self._lock = threading.RLock()
        self._policy = policy if policy is not None else PlacementPolicy.empty()
        self.policy_in_force = policy is not None
        self._clock = clock
        self.assumption_ttl = assumption_ttl
        # Settings.balance: "load" counts assumed placements; "load-without-assumptions" only seen pods.
        self.balance = balance
        self.nodes: dict[str, NodeState] = {}
        self.namespaces: dict[str, NamespaceState] = {}
        self.pods: dict[PodKey, PodState] = {}
        self.daemonsets: dict[str, DaemonSetState] = {}  # by uid: what a pod's DaemonSet owner must resolve to
        self._pods_by_node: dict[str, set[PodKey]] = {}
        self.tekton = TektonObjects()
        self.ledger = LoadLedger()
        self.tekton_coschedule: str | None = None  # Tekton's feature-flags `coschedule` (None: unknown)
        # The placement fields of Tekton's config-defaults `default-pod-template` (None: none, or unreadable).
        self.tekton_default_pod_template: dict[str, Any] | None = None
        self._node_versions: dict[str, str] = {}
        self._runs: dict[RunKey, bool] = {}  # run -> has the decision annotation
        self._run_uids: dict[RunKey, str] = {}
        self._subscribers: list[Callable[[str], None]] = []
        self._egress: dict[str, Callable[[], Mapping[str, Measurement]]] = {}  # pool -> measured egress
        self._eligible: dict[str, list[NodeState]] = {}  # pool -> eligible nodes, until a node or the policy changes

    # -- change notification ------------------------------------------------------------------
    def subscribe(self, callback: Callable[[str], None]) -> None:
        """Call `callback(kind)` after each change the reconcilers care about. It runs on the
        informer's thread, outside the lock: it must be quick (e.g. set a threading.Event)."""
        with self._lock:
            self._subscribers.append(callback)

    def _notify(self, kind: str) -> None:
        for callback in list(self._subscribers):
            try:
                callback(kind)
            except Exception:  # a subscriber must never break an informer
                logger.bind(change=kind).exception("state subscriber failed")

    # -- policy -------------------------------------------------------------------------------
    @property
    def policy(self) -> PlacementPolicy:
        return self._policy

    def set_policy(self, policy: PlacementPolicy) -> None:
        with self._lock:
            self._policy = policy
            self.policy_in_force = True
            self._eligible.clear()
        self._notify(POLICY)

    def set_tekton_coschedule(self, value: str | None) -> None:
        with self._lock:
            changed = value != self.tekton_coschedule
            self.tekton_coschedule = value
        if changed:
            self._notify(TEKTON_FLAGS)

    def set_tekton_default_pod_template(self, template: dict[str, Any] | None) -> None:
        """Admission reads it whole (it is replaced, never changed in place)."""
        self.tekton_default_pod_template = template

    # -- informer input -----------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED of a plain object dict."""
        deleted = event == "DELETED"
        notify = kind in ("Node", "Namespace")
        with self._lock:
            if kind == "Node":
                name = obj["metadata"]["name"]
                if deleted:
                    self.nodes.pop(name, None)
                    self._node_versions.pop(name, None)
                    self._eligible.clear()
                else:
                    node = NodeState.from_node(obj)
                    if self.nodes.get(name) != node:  # a heartbeat changes nothing the core reads
                        self._eligible.clear()
                    self.nodes[name] = node
                    self._node_versions[name] = obj["metadata"].get("resourceVersion") or ""
            elif kind == "Namespace":
                name = obj["metadata"]["name"]
                if deleted:
                    self.namespaces.pop(name, None)
                else:
                    self.namespaces[name] = NamespaceState.from_namespace(obj)
            elif kind == "Pod":
                notify = self._apply_pod(PodState.from_pod(obj), deleted)
            elif kind == "DaemonSet":
                daemonset = DaemonSetState.from_daemonset(obj)
                if deleted:
                    notify = self.daemonsets.pop(daemonset.uid, None) is not None
                else:  # status updates change nothing kept here: no pass for them
                    notify = self.daemonsets.get(daemonset.uid) != daemonset
                    self.daemonsets[daemonset.uid] = daemonset
            elif kind in TektonObjects.KINDS:
                meta = obj["metadata"]
                if deleted:
                    self.tekton.remove(kind, meta.get("namespace") or "default", meta["name"])
                else:
                    self.tekton.put(dict(obj), kind)
            elif kind in RUN_KINDS:
                key = _run_key(kind, obj)
                if deleted:
                    self._runs.pop(key, None)
                    self._run_uids.pop(key, None)
                else:
                    self._runs[key] = DECISION_ANNOTATION in (obj["metadata"].get("annotations") or {})
                    self._run_uids[key] = obj["metadata"].get("uid") or ""
        if notify:
            self._notify(kind)

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list (first sync or relist after 410): the state of `kind` becomes exactly `objs`."""
        objs = list(objs)
        with self._lock:
            if kind == "Node":
                self.nodes = {o["metadata"]["name"]: NodeState.from_node(o) for o in objs}
                self._eligible.clear()
                self._node_versions = {o["metadata"]["name"]: o["metadata"].get("resourceVersion") or "" for o in objs}
            elif kind == "Namespace":
                self.namespaces = {o["metadata"]["name"]: NamespaceState.from_namespace(o) for o in objs}
            elif kind == "Pod":
                self.pods.clear()
                self._pods_by_node.clear()
                for o in objs:
                    self._apply_pod(PodState.from_pod(o), False)
            elif kind == "DaemonSet":
                self.daemonsets = {d.uid: d for d in map(DaemonSetState.from_daemonset, objs)}
            elif kind in TektonObjects.KINDS:
                self.tekton.replace_kind(kind, [dict(o) for o in objs])
            elif kind in RUN_KINDS:
                self._runs = {k: v for k, v in self._runs.items() if k[0] != kind}
                self._run_uids = {k: v for k, v in self._run_uids.items() if k[0] != kind}
                for o in objs:
                    self._runs[_run_key(kind, o)] = DECISION_ANNOTATION in (o["metadata"].get("annotations") or {})
                    self._run_uids[_run_key(kind, o)] = o["metadata"].get("uid") or ""
        if kind in ("Node", "Namespace", "Pod", "DaemonSet"):
            self._notify(kind)

    def _apply_pod(self, pod: PodState, deleted: bool) -> bool:
        """Record one pod; True when it is (or was) on a pool node, so reconcilers should look."""
        key = (pod.namespace, pod.name)
        old = self.pods.pop(key, None)
        if old is not None and old.node_name:
            self._pods_by_node.get(old.node_name, set()).discard(key)
        on_pool = self._on_pool_node(old.node_name if old is not None else None)
        if deleted:
            return on_pool
        if pod.node_name:
            # The scheduler has bound it: from now on the pod itself is counted (or, finished, nothing is).
            self.ledger.settle(ledger_key("pod", pod.namespace, pod.name))
            taskrun = pod.labels.get(TASKRUN_LABEL)
            if taskrun:
                self.ledger.settle(ledger_key("taskrun", pod.namespace, taskrun))
            on_pool = on_pool or self._on_pool_node(pod.node_name)
        if pod.finished:  # neither load nor intruder: kept no longer than a deleted one
            return on_pool
        self.pods[key] = pod
        if pod.node_name:
            self._pods_by_node.setdefault(pod.node_name, set()).add(key)
        return on_pool

    def _on_pool_node(self, node: str | None) -> bool:
        if not node:
            return False
        return self._policy.pool_of(self.nodes.get(node) or NodeState(name=node)) is not None

    # -- readers ------------------------------------------------------------------------------
    def node_list(self) -> list[NodeState]:
        """A snapshot of every node (for reconcilers: no lock held while they write)."""
        with self._lock:
            return list(self.nodes.values())

    def namespace_map(self) -> dict[str, NamespaceState]:
        with self._lock:
            return dict(self.namespaces)

    def daemonset_map(self) -> dict[str, DaemonSetState]:
        """A snapshot of the DaemonSets by uid (for reconcilers)."""
        with self._lock:
            return dict(self.daemonsets)

    def node(self, name: str) -> NodeState | None:
        with self._lock:
            return self.nodes.get(name)

    def node_resource_version(self, name: str) -> str | None:
        """The node's resourceVersion as last seen (the precondition of a taint write)."""
        with self._lock:
            return self._node_versions.get(name) or None

    def runs_without_decision(self) -> list[RunKey]:
        """TaskRuns and PipelineRuns with no decision annotation (created while the webhook was not
        called, or before egress-placer was installed), sorted."""
        with self._lock:
            return sorted(k for k, placed in self._runs.items() if not placed)

    def run_uid(self, key: RunKey) -> str:
        """The uid of a run seen by the informers ("" when unknown)."""
        with self._lock:
            return self._run_uids.get(key, "")

    def namespace(self, name: str) -> NamespaceState:
        with self._lock:
            return self.namespaces.get(name) or NamespaceState(name=name)

    def pods_on(self, node: str) -> list[PodState]:
        with self._lock:
            return [self.pods[k] for k in self._pods_by_node.get(node, ())]

    def placed_counts(self, nodes: Iterable[str]) -> dict[str, int]:
        """Active pods that take a run's place on each node (DaemonSet pods do not count)."""
        with self._lock:
            out: Counter[str] = Counter()
            for node in nodes:
                for key in self._pods_by_node.get(node, ()):
                    pod = self.pods[key]
                    if pod.active and "DaemonSet" not in pod.owner_kinds:
                        out[node] += 1
            return {n: out[n] for n in nodes}

    def pool_nodes(self, pool: Pool) -> list[NodeState]:
        """The pool's eligible nodes (members, Ready, not cordoned); computed again only after a node
        or the policy changed, not on every admission."""
        with self._lock:
            nodes = self._eligible.get(pool.name)
            if nodes is None:
                nodes = self._eligible[pool.name] = eligible_nodes(pool, self._policy, self.nodes.values())
            return list(nodes)

    def loads(self, pool: Pool) -> dict[str, NodeLoad]:
        with self._lock:
            self.ledger.expire(self._clock(), self.assumption_ttl)
            nodes = self.pool_nodes(pool)
            placed = self.placed_counts([n.name for n in nodes])
            return self.ledger.loads(nodes, placed, pool.capacity)

    def set_egress_figures(self, pool: str, snapshot: Callable[[], Mapping[str, Measurement]] | None) -> None:
        """Where measured egress throughput of `pool`'s nodes comes from (a poller's snapshot), or None."""
        with self._lock:
            if snapshot is None:
                self._egress.pop(pool, None)
            else:
                self._egress[pool] = snapshot

    def egress_ratios(self, pool: Pool, loads: Mapping[str, NodeLoad]) -> dict[str, RatioFigure] | None:
        """Measured-egress load figures of the pool's nodes (None when the pool has no egress source)."""
        snapshot = self._egress.get(pool.name)
        if snapshot is None or pool.egress_load is None:
            return None
        source = pool.egress_load.prometheus
        return rank_nodes(loads, snapshot(), pool.egress_load.bandwidth_of, self._clock(), source.max_age)

    def choose_and_assume(self, pool: Pool, key: str, salt: str) -> tuple[str | None, dict[str, NodeLoad]]:
        """Pick the least-loaded node of `pool` and count the placement at once (so a burst spreads).

        The load is runs (placed + assumed) against capacity, combined with measured egress
        throughput when the pool has an egress source (`core.egress`). Returns the node (None when
        the pool has no eligible node) and the loads that were seen.
        """
        with self._lock:
            loads = self.loads(pool)
            nodes = [n for n in self.pool_nodes(pool)]
            seen = loads if self.balance == "load" else {n: replace(v, assumed=0) for n, v in loads.items()}
            figures = self.egress_ratios(pool, seen)
            ratios = {name: f.ratio for name, f in figures.items()} if figures is not None else None
            node = choose_node(nodes, seen, salt=salt, ratios=ratios)
            if node is not None:
                self.ledger.assume(key, pool.name, node, self._clock())
            return node, loads

    def forget(self, key: str) -> None:
        with self._lock:
            self.ledger.settle(key)


def _run_key(kind: str, obj: Mapping[str, Any]) -> RunKey:
    meta = obj["metadata"]
    return (kind, meta.get("namespace") or "default", meta["name"])
