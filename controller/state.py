"""The controller's in-memory picture of the cluster: what admission reads and reconcilers act on.

Informers feed it (`apply` and `replace`) into one store per resource (controller.store); the
admission handlers and reconcilers read it. It makes no API call. Every method is thread-safe. Only
the fields the core needs are kept (NodeState, NamespaceState, PodState, RunRecord, the TektonObjects
index), so memory does not grow with what tenants write (kube.informer.KEPT_LABELS, KEPT_ANNOTATIONS).
Finished pods (Succeeded, Failed) are not kept: they hold no node.

`subscribe(callback)` tells the reconcile loop that something it acts on changed: nodes,
namespaces, the policy, Tekton's coschedule flag, DaemonSets coming and going (they decide which pods
are node agents), and pods on pool nodes (other pods do not wake it).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Iterable, Mapping

from loguru import logger

from controller.core.balance import LoadLedger, ledger_key
from controller.core.egress import Measurement
from controller.core.images import TASKRUN_LABEL, TektonObjects
from controller.core.load_index import PoolLoads
from controller.core.model import DECISION_ANNOTATION, DaemonSetState, NamespaceState, NodeLoad, NodeState, PodState
from controller.core.policy import PlacementPolicy, Pool
from controller.core.queue import PIPELINERUN_LABEL, QUEUE_ANNOTATION, LineSummary, PoolQueue, QueueEntry, RunFacts, slots
from controller.store import Store, release

RUN_KINDS = ("TaskRun", "PipelineRun")
POLICY = "Policy"  # the kind passed to subscribers when the policy changes
TEKTON_FLAGS = "TektonFeatureFlags"  # ... and when Tekton's coschedule flag changes
PodKey = tuple[str, str]
RunKey = tuple[str, str, str]  # kind, namespace, name
QUEUE_SUMMARY_SECONDS = 1.0  # admission reads a queued pool's line summary at most this old (plus its own additions)
LOADS_SHOWN = 10  # nodes whose load a choice reports: the chosen one and the least loaded others


@dataclass(frozen=True)
class Choice:
    """A node choice and the load picture it saw (before the placement it made)."""

    node: str | None
    # The chosen node's load and the least loaded others', at most LOADS_SHOWN (shown): not every
    # node's, so a choice costs the same in a pool of 10 nodes or 10,000.
    loads: Mapping[str, NodeLoad] = field(default_factory=dict)
    more_nodes: int = 0  # eligible nodes of the pool not in `loads`


@dataclass(frozen=True)
class RunRecord:
    """What is kept of a TaskRun or PipelineRun: has it a decision, its uid, its queue entry (core.queue)."""

    decided: bool
    uid: str
    entry: QueueEntry | None

    @classmethod
    def of(cls, kind: str, obj: Mapping[str, Any]) -> "RunRecord":
        """The queue entry is read once here, not per admission (has_pod unset: see queue_entries)."""
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        value = annotations.get(QUEUE_ANNOTATION)
        conditions = (obj.get("status") or {}).get("conditions") or []
        done = any(c.get("type") == "Succeeded" and c.get("status") in ("True", "False") for c in conditions if isinstance(c, Mapping))
        key = _run_key(kind, obj)
        facts = RunFacts(kind, key[1], key[2], meta.get("uid") or "", value, str((obj.get("spec") or {}).get("status") or ""), done)
        entry = facts.queue_entry(has_pod=False) if value is not None else None
        return cls(DECISION_ANNOTATION in annotations, meta.get("uid") or "", entry)


class ClusterState:
    """The stores (one per resource: `stores[kind]`) and the views over them: the load picture, the
    queue's line cache. Readers of a store's snapshot (`nodes`, `pods`, `namespace()`...) take no lock;
    `_lock` orders writers (informer threads, admission's assumptions) and is held by a relist only
    for its swap: the new snapshot is built off to the side."""

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
        self.stores: dict[str, Store[Any, Any]] = {
            "Node": Store(_name, NodeState.from_node),
            "Namespace": Store(_name, NamespaceState.from_namespace),
            # pods by node, and the bound pods of each run (by its label: the queue's has_pod)
            "Pod": Store(lambda o: _run_key("Pod", o)[1:], _kept_pod, {"node": lambda pod: pod.node_name or None,
                                                                     "TaskRun": partial(_bound_run, TASKRUN_LABEL),
                                                                     "PipelineRun": partial(_bound_run, PIPELINERUN_LABEL)}),
            "DaemonSet": Store(lambda o: o["metadata"].get("uid") or "", DaemonSetState.from_daemonset),
            **{kind: Store(partial(_run_key, kind), partial(RunRecord.of, kind), {"queued": _queued}) for kind in RUN_KINDS},
        }
        # What a change of each kind does beyond its store: True when the reconcilers should look.
        self._changed: dict[str, Callable[[Mapping[str, Any], bool, Any, Any], bool]] = {
            "Node": self._node_changed,
            "Namespace": lambda obj, deleted, old, new: True,
            "Pod": self._pod_changed,
            "DaemonSet": lambda obj, deleted, old, new: old != new,  # status updates change nothing kept
            **{kind: _entry_changed for kind in RUN_KINDS},
        }
        self.tekton = TektonObjects()
        self.ledger = LoadLedger(on_change=self._assumed_changed)
        self.tekton_coschedule: str | None = None  # Tekton's feature-flags `coschedule` (None: unknown)
        # The placement fields of Tekton's config-defaults `default-pod-template` (None: none, or unreadable).
        self.tekton_default_pod_template: dict[str, Any] | None = None
        self._node_versions: dict[str, str] = {}
        self._line_summaries: dict[str, tuple[float, LineSummary]] = {}  # pool -> (when, summary)
        self._line_lock = threading.Lock()
        self._subscribers: list[Callable[[str], None]] = []
        self._egress: dict[str, Mapping[str, Measurement]] = {}  # pool -> measured egress, as last polled
        # The load picture node choice reads, kept current on events (pods, assumptions, nodes, the
        # policy, egress figures) so that no decision rebuilds it: pods counted per node, the pool
        # each eligible node belongs to, and one load index per pool.
        self._placed: Counter[str] = Counter()
        self._member_of: dict[str, str] = {}
        self._pool_loads: dict[str, PoolLoads] = {}
        self._rebuild_pool_loads()

    # Each store's items now (a snapshot: read with no lock). DaemonSets by uid: what a pod's owner must resolve to.
    nodes = property(lambda self: self.stores["Node"].items)
    namespaces = property(lambda self: self.stores["Namespace"].items)
    pods = property(lambda self: self.stores["Pod"].items)
    daemonsets = property(lambda self: self.stores["DaemonSet"].items)

    @property
    def _queued(self) -> dict[RunKey, QueueEntry]:
        """The runs carrying a queue entry, has_pod unset."""
        return {k: r.entry for kind in RUN_KINDS for k, r in self.stores[kind].snapshot.under("queued", True).items()}

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
            self._rebuild_pool_loads()
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
        with self._lock:
            if kind in TektonObjects.KINDS:
                meta = obj["metadata"]
                if deleted:
                    self.tekton.remove(kind, meta.get("namespace") or "default", meta["name"])
                else:
                    self.tekton.put(dict(obj), kind)
                return
            old, new = self.stores[kind].apply(obj, deleted)
            notify = self._changed[kind](obj, deleted, old, new)
        if notify:
            self._notify(kind)

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list (first sync or relist after 410): the state of `kind` becomes exactly `objs`.
        The new snapshot (and, for pods, the new counts) is built with no lock held; the lock is
        taken only to swap it in."""
        if kind in TektonObjects.KINDS:
            with self._lock:
                self.tekton.replace_kind(kind, [dict(o) for o in objs])
            return
        store, objs = self.stores[kind], list(objs)
        snapshot = store.build(objs)
        if kind == "Pod":  # only this informer's thread writes pods: the counts can be compared off to the side
            placed = Counter(node for node in map(_place_taken, snapshot.items.values()) if node is not None)
            moved = {n for n in placed.keys() | self._placed.keys() if placed[n] != self._placed[n]}
            settled = [key for obj in objs for key in _settled_by(obj) if key in self.ledger]
        with self._lock:
            retired = list(store.snapshot.items.values())  # freed after the lock, a step at a time
            store.snapshot = snapshot
            if kind == "Node":
                self._node_versions = {o["metadata"]["name"]: o["metadata"].get("resourceVersion") or "" for o in objs}
                self._rebuild_pool_loads()
            elif kind == "Pod":
                self._placed = placed
                for node in moved:
                    self._count_placed(node, 0)
                for key in settled:
                    self.ledger.settle(key)
        self._notify(kind)
        release(retired)

    def _node_changed(self, obj: Mapping[str, Any], deleted: bool, old: NodeState | None, new: NodeState | None) -> bool:
        name = obj["metadata"]["name"]
        if old != new:  # a heartbeat changes nothing the core reads
            self._place_node(name, new)
        if deleted:
            self._node_versions.pop(name, None)
        else:
            self._node_versions[name] = obj["metadata"].get("resourceVersion") or ""
        return True

    def _pod_changed(self, obj: Mapping[str, Any], deleted: bool, old: PodState | None, new: PodState | None) -> bool:
        """Record one pod; True when it is (or was) on a pool node, so reconcilers should look."""
        on_pool = self._on_pool_node(old.node_name if old is not None else None)
        if not deleted:
            for key in _settled_by(obj):
                self.ledger.settle(key)
            on_pool = on_pool or self._on_pool_node((obj.get("spec") or {}).get("nodeName"))
        before, after = _place_taken(old), _place_taken(new)
        if before != after:  # most updates (status, annotations) leave the count where it was
            if before is not None:
                self._count_placed(before, -1)
            if after is not None:
                self._count_placed(after, 1)
        return on_pool

    # -- the load picture ---------------------------------------------------------------------
    def _rebuild_pool_loads(self) -> None:
        """Every pool's load index from the nodes, counts and figures (the policy, every node or every
        pod changed at once)."""
        count_assumed = self.balance == "load"
        self._pool_loads = {
            pool.name: PoolLoads(pool.capacity, count_assumed=count_assumed, egress=pool.egress_load)
            for pool in self._policy.pools
        }
        for name, loads in self._pool_loads.items():
            if loads.egress is not None and name in self._egress:
                loads.set_figures(self._egress[name])
        self._member_of = {}
        for name, node in self.nodes.items():
            self._place_node(name, node)

    def _place_node(self, name: str, node: NodeState | None) -> None:
        """Node `name` changed (None: deleted): it joins, stays in or leaves its pool's index."""
        pool = self._policy.pool_of(node) if node is not None and node.ready and not node.unschedulable else None
        old = self._member_of.get(name)
        if old is not None and (pool is None or pool.name != old):
            self._pool_loads[old].remove(name)
            del self._member_of[name]
        if pool is not None and node is not None:
            self._member_of[name] = pool.name
            self._pool_loads[pool.name].put(name, node.allocatable_pods, self._placed[name], self.ledger.assumed_on(name))

    def _count_placed(self, node: str, change: int) -> None:
        self._placed[node] += change
        if self._placed[node] <= 0:
            del self._placed[node]
        pool = self._member_of.get(node)
        if pool is not None:
            self._pool_loads[pool].set_placed(node, self._placed[node])

    def _assumed_changed(self, node: str) -> None:
        """The ledger's count on `node` changed (it calls this, under the lock its caller holds)."""
        pool = self._member_of.get(node)
        if pool is not None:
            self._pool_loads[pool].set_assumed(node, self.ledger.assumed_on(node))

    def _on_pool_node(self, node: str | None) -> bool:
        if not node:
            return False
        return self._policy.pool_of(self.nodes.get(node) or NodeState(name=node)) is not None

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

    def runs_without_decision(self) -> list[RunKey]:
        """TaskRuns and PipelineRuns with no decision annotation (created while the webhook was not
        called, or before egress-placer was installed), sorted."""
        return sorted(k for kind in RUN_KINDS for k, run in self.stores[kind].items.items() if not run.decided)

    def run_uid(self, key: RunKey) -> str:
        """The uid of a run seen by the informers ("" when unknown)."""
        run = self.stores[key[0]].items.get(key)
        return run.uid if run is not None else ""

    # -- the queue (core.queue) -------------------------------------------------------------------
    def queue_entries(self, pool: str | None = None) -> list[QueueEntry]:
        """The runs carrying a queue entry (of `pool`, or every pool), each with whether a pod of it is
        bound to a node. O(queued runs)."""
        pods = self.stores["Pod"].snapshot
        return [replace(entry, has_pod=True) if (namespace, name) in pods.indexes[kind] else entry
                for (kind, namespace, name), entry in self._queued.items() if pool is None or entry.pool == pool]

    def pool_queue(self, pool: Pool) -> PoolQueue | None:
        """The queued pool's slots (runsPerNode on each eligible node carrying its taint) and the active
        Tekton pods bound to its nodes, per namespace. None when the pool does not queue."""
        if pool.queue is None:
            return None
        with self._lock:
            loads = self._pool_loads.get(pool.name)
            names = sorted(loads.names()) if loads is not None else []
        nodes, pods_by_node = self.nodes, self.stores["Pod"].snapshot
        taint = pool.taint_for()
        tainted = [n for n in names if n in nodes and any(t.key == taint.key and t.value == taint.value for t in nodes[n].taints)]
        pods: Counter[str] = Counter()
        for node in names:
            for pod in pods_by_node.under("node", node).values():
                if pod.active and TASKRUN_LABEL in pod.labels:
                    pods[pod.namespace] += 1
        return PoolQueue(pool.name, pool.queue, pool.placement, slots(pool.queue.runs_per_node, len(tainted)), dict(pods))

    def queue_counts(self, pool: Pool, now: float) -> tuple[int, int, int] | None:
        """(waiting, slots, occupied) of a queued pool now; None when it does not queue. O(pods + queued runs)."""
        picture = self.pool_queue(pool)
        if picture is None:
            return None
        summary = LineSummary.of(picture, self.queue_entries(pool.name), now)
        return sum(summary.waiting.values()), summary.slots, summary.occupied

    def join_queue(self, pool: Pool, namespace: str, now: float) -> tuple[int, int, bool] | None:
        """A run of `namespace` joins `pool`'s line now: its place, the line's length, and whether a slot
        is free for it. From a summary at most QUEUE_SUMMARY_SECONDS old (rebuilt: O(pods + queued runs)),
        counted on with the runs admission queued since: O(namespaces) per call. None: no queue.
        Only admission calls it, on the event loop or in its large-review thread: the summaries have
        a lock of their own, which no relist takes."""
        with self._line_lock:
            cached = self._line_summaries.get(pool.name)
            if cached is None or now - cached[0] > QUEUE_SUMMARY_SECONDS or cached[0] > now:
                picture = self.pool_queue(pool)
                if picture is None:
                    return None
                cached = (now, LineSummary.of(picture, self.queue_entries(pool.name), now))
            summary = cached[1]
            place, length = summary.place_of_new(namespace, now)
            waiting = dict(summary.waiting)
            waiting[namespace] = waiting.get(namespace, 0) + 1
            heads = {**summary.heads, namespace: summary.heads.get(namespace, now)}
            self._line_summaries[pool.name] = (cached[0], replace(summary, waiting=waiting, heads=heads))
            return place, length, place <= summary.slots - summary.occupied

    def namespace(self, name: str) -> NamespaceState:
        return self.namespaces.get(name) or NamespaceState(name=name)

    def pods_on(self, node: str) -> list[PodState]:
        return list(self.stores["Pod"].snapshot.under("node", node).values())

    def placed_counts(self, nodes: Iterable[str]) -> dict[str, int]:
        """Active pods that take a run's place on each node (DaemonSet pods do not count)."""
        return {n: self._placed.get(n, 0) for n in nodes}

    def pool_nodes(self, pool: Pool) -> list[NodeState]:
        """The pool's eligible nodes (members, Ready, not cordoned), by name; kept on node and policy
        changes. O(n): for the egress pollers and `status`, not for a decision."""
        with self._lock:
            loads = self._pool_loads.get(pool.name)
            return [self.nodes[name] for name in sorted(loads.names())] if loads is not None else []

    def loads(self, pool: Pool) -> dict[str, NodeLoad]:
        """The load of each of the pool's eligible nodes (placed, assumed, capacity). O(n): for `status`,
        `explain` and tests; a decision reads only what `choose` reports."""
        with self._lock:
            self.ledger.expire(self._clock(), self.assumption_ttl)
            loads = self._pool_loads.get(pool.name)
            return loads.loads() if loads is not None else {}

    def set_egress_figures(self, pool: str, figures: Mapping[str, Measurement] | None) -> None:
        """The measured egress throughput of `pool`'s nodes as last polled (a new mapping each poll,
        not changed after), or None when the pool has no source any more."""
        with self._lock:
            if figures is None:
                self._egress.pop(pool, None)
            else:
                self._egress[pool] = figures
            loads = self._pool_loads.get(pool)
            if loads is not None and loads.egress is not None:
                loads.refresh(self._clock())
                loads.set_figures(figures or {})

    def choose(self, pool: Pool, salt: str, shown: int = LOADS_SHOWN) -> Choice:
        """The least-loaded node of `pool` now, assuming nothing (a dry run). O(log n) in the pool's size."""
        return self.choose_and_assume(pool, None, salt, shown)

    def choose_and_assume(self, pool: Pool, key: str | None, salt: str, shown: int = LOADS_SHOWN) -> Choice:
        """Pick the least-loaded node of `pool` and count the placement at once (so a burst spreads).

        The load is runs (placed + assumed) against capacity, combined with measured egress
        throughput when the pool has an egress source (`core.egress`). Returns the node (None when
        the pool has no eligible node) and the loads seen before this placement: the chosen node's
        and the least loaded others', at most `shown`. O(log n) in the pool's size. `key` None: assume nothing.
        """
        with self._lock:
            loads = self._current(pool)
            if loads is None:
                return Choice(None)
            choice = self._choice(loads, loads.choose(salt), shown)
            if choice.node is not None and key is not None:
                self.ledger.assume(key, pool.name, choice.node, self._clock())
            return choice

    def _current(self, pool: Pool) -> PoolLoads | None:
        """The pool's load index, with stale assumptions dropped and egress figures judged at now."""
        now = self._clock()
        self.ledger.expire(now, self.assumption_ttl)
        loads = self._pool_loads.get(pool.name)
        if loads is not None:
            loads.refresh(now)
        return loads

    @staticmethod
    def _choice(loads: PoolLoads, node: str | None, shown: int) -> Choice:
        listed = loads.least_loaded(shown, include=node) if node is not None else []
        return Choice(node, {load.name: load for load in listed}, len(loads) - len(listed))

    def forget(self, key: str) -> None:
        with self._lock:
            self.ledger.settle(key)


def _place_taken(pod: PodState | None) -> str | None:
    """The node whose place `pod` takes (as a run): it is pending or running there, not being deleted,
    and no DaemonSet's. None when it takes none."""
    if pod is None or not pod.node_name or not pod.active or "DaemonSet" in pod.owner_kinds:
        return None
    return pod.node_name


def _kept_pod(obj: Mapping[str, Any]) -> PodState | None:
    """Finished pods (Succeeded, Failed) are not kept: neither load nor intruder."""
    pod = PodState.from_pod(obj)
    return None if pod.finished else pod


def _settled_by(obj: Mapping[str, Any]) -> list[str]:
    """The assumptions a pod bound to a node settles: from now on the pod itself is counted (or,
    finished, nothing is): its own and its TaskRun's."""
    if not (obj.get("spec") or {}).get("nodeName"):
        return []
    namespace, name = _run_key("Pod", obj)[1:]
    taskrun = (obj["metadata"].get("labels") or {}).get(TASKRUN_LABEL)
    return [ledger_key("pod", namespace, name)] + ([ledger_key("taskrun", namespace, taskrun)] if taskrun else [])


def _bound_run(label: str, pod: PodState) -> tuple[str, str] | None:
    """(namespace, run) of a pod bound to a node and labelled with its run."""
    return (pod.namespace, pod.labels[label]) if pod.node_name and label in pod.labels else None


def _queued(run: RunRecord) -> bool | None:
    return True if run.entry is not None else None


def _entry_changed(obj: Mapping[str, Any], deleted: bool, old: RunRecord | None, new: RunRecord | None) -> bool:
    """A queue entry came, went or changed: the release reconciler looks again."""
    return (old.entry if old else None) != (new.entry if new else None)


def _name(obj: Mapping[str, Any]) -> str:
    return obj["metadata"]["name"]


def _run_key(kind: str, obj: Mapping[str, Any]) -> RunKey:
    meta = obj["metadata"]
    return (kind, meta.get("namespace") or "default", meta["name"])
