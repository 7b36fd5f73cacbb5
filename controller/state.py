"""The controller's in-memory picture of the cluster: what admission reads and reconcilers act on.

Informers feed it (`apply` and `replace`) into one store per resource (controller.store); the
admission handlers and reconcilers read it. It makes no API call. Every method is thread-safe. Only
the fields the core needs are kept (NodeState, NamespaceState, PodState, RunRecord, the Tekton
definitions of tekton.view.TektonView), so memory does not grow with what tenants write
(kube.informer.KEPT_LABELS, KEPT_ANNOTATIONS).
Finished pods (Succeeded, Failed) are not kept: they hold no node.

`subscribe(callback)` tells the reconcile loop that something it acts on changed: nodes (not a
heartbeat, which changes nothing kept: at 5,000 nodes heartbeats would keep the loop passing back to back),
namespaces, the policy, Tekton's coschedule flag, DaemonSets coming and going (they decide which pods
are node agents), and pods on pool nodes (other pods do not wake it).
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable, Iterable, Mapping

from loguru import logger

from controller.budgets.core import BUDGETS_ANNOTATION
from controller.budgets.view import BudgetsView, budgeted
from controller.changes import NodeChanges
from controller.core.model import HOSTNAME_LABEL, DaemonSetState, NamespaceState, NodeState, PodState
from controller.core.policy import PlacementPolicy
from controller.load.view import LoadView
from controller.missed_runs.view import MissedRuns
from controller.queue.view import RUN_KINDS, QueueView, RunRecord, bound_taskrun, gated, run_key, run_of
from controller.store import Store, release
from controller.suggest.view import MeasuredView
from controller.tekton.view import TEKTON_FLAGS, TektonView

POLICY = "Policy"  # the kind passed to subscribers when the policy changes (TEKTON_FLAGS: Tekton's coschedule flag)
__all__ = ["POLICY", "TEKTON_FLAGS", "ClusterState"]


class ClusterState:
    """The stores (one per resource: `stores[kind]`) and the views over them, one per feature: `load`
    (the load picture and assumptions), `queue`, `missed_runs`, `tekton` (Tekton's definitions and
    settings). Readers of a store's snapshot (`nodes`, `pods`, `namespace()`...) take no lock; `_lock`
    orders the informers' writes and is held by a relist only for its swap: the new snapshot is built
    off to the side. Admission's own writes (assumed placements, queue lines) and the Tekton objects'
    writes take only their view's lock."""

    def __init__(
        self,
        policy: PlacementPolicy | None,
        clock: Callable[[], float],
        assumption_ttl: float = 60.0,
        balance: str = "load",
    ) -> None:
        """`policy` None: no valid policy in force yet (`policy` is then the empty one: nothing is
        placed, and `policy_in_force` is False so the taint reconciler leaves the taints alone).
        `balance` (Settings.balance): "load" counts assumed placements; "load-without-assumptions" only seen pods."""
        self._lock = threading.RLock()
        self._policy = policy if policy is not None else PlacementPolicy.empty()
        self.policy_in_force = policy is not None
        self.stores: dict[str, Store[Any, Any]] = {
            # the nodes whose hostname label is not their name (absent, or told otherwise): `hostnames_are_names`
            "Node": Store(lambda o: o["metadata"]["name"], NodeState.from_node,
                          {"hostname": lambda node: None if node.labels.get(HOSTNAME_LABEL) == node.name else "differs"}),
            "Namespace": Store(lambda o: o["metadata"]["name"], NamespaceState.from_namespace),
            # pods by node, and the bound pods of each TaskRun by its owner's uid (the queue's has_pod; a
            # coscheduled PipelineRun's through the TaskRuns claiming it, the runs' "pipelinerun" index)
            "Pod": Store(lambda o: run_key("Pod", o)[1:], _kept_pod, {"node": lambda pod: pod.node_name or None,
                                                                    "TaskRun": bound_taskrun,
                                                                    "run": run_of,
                                                                    "gated": gated,
                                                                    "budgeted": budgeted}),
            "DaemonSet": Store(lambda o: o["metadata"].get("uid") or "", DaemonSetState.from_daemonset),
            **{kind: Store(partial(run_key, kind), partial(RunRecord.of, kind),
                           {"queued": RunRecord.queued, "pipelinerun": RunRecord.claimed_uid}) for kind in RUN_KINDS},
        }
        # What a change of each kind does beyond its store: True when the reconcilers should look.
        self._changed: dict[str, Callable[[Mapping[str, Any], bool, Any, Any], bool]] = {
            "Node": self._node_changed,
            "Namespace": self._namespace_changed,
            "Pod": self._pod_changed,
            "DaemonSet": self._daemonset_changed,
            **{kind: partial(self._run_changed, kind) for kind in RUN_KINDS},
        }
        self._node_versions: dict[str, str] = {}
        self.changes = NodeChanges()  # which nodes changed, for the reconcilers' passes (controller.changes)
        self._subscribers: list[Callable[[str], None]] = []
        self.load = LoadView(self._policy, lambda: self.nodes, clock, assumption_ttl, balance, lambda name: self.namespace(name),
                             lambda kind, namespace, name: self.stores[kind].items.get((kind, namespace, name)),
                             lambda *run: self.queue.has_run_pod(*run))
        self.queue = QueueView(self.stores, self.load, lambda: self._policy)
        self.budgets = BudgetsView(self.stores, self.load, self.queue, lambda: self._policy)
        self.missed_runs = MissedRuns(self.stores)
        self.tekton = TektonView(self._notify)
        self.history = MeasuredView()  # the pools' measured sets (a pool's `history` rule)

    # Each store's items now (a snapshot: read with no lock). DaemonSets by uid: what a pod's owner must resolve to.
    nodes = property(lambda self: self.stores["Node"].items)
    namespaces = property(lambda self: self.stores["Namespace"].items)
    pods = property(lambda self: self.stores["Pod"].items)
    daemonsets = property(lambda self: self.stores["DaemonSet"].items)

    @property
    def hostnames_are_names(self) -> bool:
        """Is every node's `kubernetes.io/hostname` label its name (the kubelet's default)? Then a pool's
        listed nodes are placed by that label, in one requirement (core.patches.pool_terms, `by_hostname`),
        and the scheduler reads the same nodes. One node that differs, or lacks the label (Karpenter's KWOK
        provider names its nodes apart from their hostnames): one `metadata.name` term per node, as before."""
        return not self.stores["Node"].snapshot.under("hostname", "differs")

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
            self.load.rebuild(policy)
        self.changes.everything()
        self._notify(POLICY)

    # -- informer input -----------------------------------------------------------------------
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED of a plain object dict."""
        if kind in TektonView.KINDS:
            self.tekton.apply(kind, event, obj)
            return
        deleted = event == "DELETED"
        with self._lock:
            old, new = self.stores[kind].apply(obj, deleted)
            notify = self._changed[kind](obj, deleted, old, new)
        if notify:
            self._notify(kind)

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list (first sync or relist after 410): the state of `kind` becomes exactly `objs`.
        The new snapshot (and, for pods, the new counts) is built with no lock held; the lock is
        taken only to swap it in."""
        if kind in TektonView.KINDS:
            self.tekton.replace(kind, objs)
            return
        store, objs = self.stores[kind], list(objs)
        snapshot = store.build(objs)
        if kind in RUN_KINDS:
            self.load.runs_replaced(kind, objs)
        if kind == "Pod":  # only this informer's thread writes pods: the counts can be compared off to the side
            counts = self.load.count_pods(snapshot.items.values(), objs)
            self.budgets.pods_listed(PodState.from_pod(o) for o in objs if BUDGETS_ANNOTATION in ((o.get("metadata") or {}).get("annotations") or {}))
        elif kind == "Node":  # ... and nodes: the nodes that changed, compared off to the side
            moved = _changed_items(store.snapshot.items, snapshot.items)
        with self._lock:
            retired = list(store.snapshot.items.values())  # freed after the lock, a step at a time
            store.snapshot = snapshot
            if kind == "Node":
                self._node_versions = {o["metadata"]["name"]: o["metadata"].get("resourceVersion") or "" for o in objs}
                # Node by node, not a rebuild of every pool's index: each call holds the load view's lock
                # (which admission's node choice waits for) for one node, never for all 5,000.
                for name, node in moved:
                    self.load.node_changed(name, node)
            elif kind == "Pod":
                self.load.pods_replaced(counts)
        if kind in ("Node", "Pod", "Namespace", "DaemonSet"):
            self.changes.everything()
        self._notify(kind)
        if kind == "Pod":
            release(counts[2], freeze=False)  # each listed pod's claim, as read
        release(retired)

    def _node_changed(self, obj: Mapping[str, Any], deleted: bool, old: NodeState | None, new: NodeState | None) -> bool:
        name = obj["metadata"]["name"]
        if old != new:  # a heartbeat changes nothing the core reads
            self.load.node_changed(name, new)
            self.changes.nodes(name)
        if deleted:
            self._node_versions.pop(name, None)
        else:
            self._node_versions[name] = obj["metadata"].get("resourceVersion") or ""
        return old != new

    def _namespace_changed(self, obj: Mapping[str, Any], deleted: bool, old: NamespaceState | None, new: NamespaceState | None) -> bool:
        if old != new:  # a namespace's labels decide which pools let its pods stay, on any node
            self.changes.everything()
        return True

    def _daemonset_changed(self, obj: Mapping[str, Any], deleted: bool, old: DaemonSetState | None, new: DaemonSetState | None) -> bool:
        if old != new:  # status updates change nothing kept; a DaemonSet decides its pods' rights on any node
            self.changes.everything()
        return old != new

    def _run_changed(self, kind: str, obj: Mapping[str, Any], deleted: bool, old: RunRecord | None, new: RunRecord | None) -> bool:
        self.load.run_changed(kind, obj, deleted)
        return RunRecord.entry_changed(obj, deleted, old, new)

    def _pod_changed(self, obj: Mapping[str, Any], deleted: bool, old: PodState | None, new: PodState | None) -> bool:
        """Record one pod; True when it is (or was) on a pool node, or waits for a pool slot (gated), so
        reconcilers should look."""
        self.load.pod_changed(obj, deleted, old, new)
        if old != new:
            self.changes.nodes(old.node_name if old is not None else None, new.node_name if new is not None else None)
        if old is not None and new is None:  # finished or deleted: its budget starts outlive it (budgets.view)
            self.budgets.pod_ended(old)
        if any(p is not None and gated(p) for p in (old, new)):
            return True
        nodes = [old.node_name if old is not None else None] + ([] if deleted else [(obj.get("spec") or {}).get("nodeName")])
        return any(node and self._policy.pool_of(self.nodes.get(node) or NodeState(name=node)) is not None for node in nodes)

    # -- readers ------------------------------------------------------------------------------
    def node_list(self) -> list[NodeState]:
        """Every node (for reconcilers)."""
        return list(self.nodes.values())

    def namespace_map(self) -> dict[str, NamespaceState]:
        return dict(self.namespaces)

    def daemonset_map(self) -> dict[str, DaemonSetState]:
        """The DaemonSets by uid (for reconcilers)."""
        return dict(self.daemonsets)

    def node(self, name: str) -> NodeState | None:
        return self.nodes.get(name)

    def node_resource_version(self, name: str) -> str | None:
        """The node's resourceVersion as last seen (the precondition of a taint write)."""
        return self._node_versions.get(name) or None

    def namespace(self, name: str) -> NamespaceState:
        return self.namespaces.get(name) or NamespaceState(name=name)

    def pods_on(self, node: str) -> list[PodState]:
        return list(self.stores["Pod"].snapshot.under("node", node).values())


def _changed_items(before: Mapping[str, NodeState], after: Mapping[str, NodeState]) -> list[tuple[str, NodeState | None]]:
    """The nodes of `after` that are new or differ from `before`, then those gone (None)."""
    changed: list[tuple[str, NodeState | None]] = [(n, node) for n, node in after.items() if before.get(n) != node]
    return changed + [(n, None) for n in before if n not in after]


def _kept_pod(obj: Mapping[str, Any]) -> PodState | None:
    """Finished pods (Succeeded, Failed) are not kept: neither load nor intruder."""
    pod = PodState.from_pod(obj)
    return None if pod.finished else pod
