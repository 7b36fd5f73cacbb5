"""The load picture node choice reads, kept current on events so that no decision rebuilds it: pods
counted per node, the pool each eligible node belongs to, one load index per pool (`load.index`),
the assumption ledger (`load.core.LoadLedger`) and the measured egress figures.

ClusterState feeds it (policy, node and pod changes); admission asks it (`choose_and_assume`). It has
a lock of its own: a relist of any other kind never holds it, one of pods or nodes only for its swap.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from controller.core.egress import Measurement
from controller.core.model import DECISION_ANNOTATION, REVIEW_ANNOTATION, NamespaceState, NodeState, NodeLoad, OwnerRef, PodState
from controller.core.policy import PlacementPolicy, Pool
from controller.load.core import ClaimBook, LoadLedger, Seen, ledger_key
from controller.load.index import PoolLoads
from controller.queue.core import QUEUE_ANNOTATION, claimed_taskrun, decided_placement, is_run_pod, parse_time

HOLD_CHUNK = 256  # pool nodes (or a relist's claims: ~0.1 ms) a pass handles per hold of the lock (~15 µs, under a review's time)
LOADS_SHOWN = 10  # nodes whose load a choice reports: the chosen one and the least loaded others
# a relist's counts: placed per node, nodes moved, and each pod as the claim book reads it
PodCounts = tuple[Counter[str], set[str], list["PodSeen"]]
PodSeen = tuple[str, Seen | None]  # (ledger key, the version; None: gone, finished)


class KnownRun(Protocol):
    """What the run stores keep of a TaskRun or PipelineRun (queue.view.RunRecord)."""

    @property
    def decided(self) -> bool: ...

    @property
    def uid(self) -> str: ...

    @property
    def pod_name(self) -> str: ...

    @property
    def pipelinerun(self) -> OwnerRef | None: ...


# (kind, namespace, name) -> the run as cached, None when it is not (yet)
RunLookup = Callable[[str, str, str], "KnownRun | None"]
# (kind, namespace, name, uid, status.podName) -> has the run a pod of its own in the cache (queue.view.QueueView.has_run_pod)
PodLookup = Callable[[str, str, str, str, str], bool]


@dataclass(frozen=True)
class Choice:
    """A node choice and the load picture it saw (before the placement it made)."""

    node: str | None
    # The chosen node's load and the least loaded others', at most LOADS_SHOWN (shown): not every
    # node's, so a choice costs the same in a pool of 10 nodes or 10,000.
    loads: Mapping[str, NodeLoad] = field(default_factory=dict)
    more_nodes: int = 0  # eligible nodes of the pool not in `loads`


class LoadView:
    """`nodes()`: the node store's items now; `namespace(name)`: a namespace as the store has it.
    `balance` (Settings.balance): "load" counts assumed placements; "load-without-assumptions" only seen pods.
    `clock`: wall time (decision records count from the API server's creationTimestamp).

    Assumed placements are this replica's own (admission) and every replica's: the decision record
    (`egress-placer.io/decision`, pool and node) on each run and pod the API server stores, from the
    moment the informers see it (`load.core.ClaimBook`). The record is the owner's to edit, so one counts
    only when it names an eligible node of its pool that the object's namespace may use; it is read from
    the first version seen; it counts for `assumption_ttl` seconds after the object's creation; a run held
    pending (`spec.status`, a queue entry) counts nothing (docs/security.md, "Shared load")."""

    def __init__(self, policy: PlacementPolicy, nodes: Callable[[], Mapping[str, NodeState]],
                 clock: Callable[[], float], assumption_ttl: float, balance: str,
                 namespace: Callable[[str], NamespaceState] | None = None, run: RunLookup | None = None,
                 run_pod: PodLookup | None = None) -> None:
        self._lock = threading.RLock()
        self._nodes, self._clock, self.assumption_ttl, self.balance = nodes, clock, assumption_ttl, balance
        self._namespace = namespace or (lambda name: NamespaceState(name=name))
        self._run: RunLookup = run or (lambda kind, namespace, name: None)
        self._run_pod: PodLookup = run_pod or (lambda kind, namespace, name, uid, pod_name: False)
        self.ledger = LoadLedger(on_change=self._assumed_changed)
        self.claims = ClaimBook(self.ledger, assumption_ttl)
        self._egress: dict[str, Mapping[str, Measurement]] = {}  # pool -> measured egress, as last polled
        self._placed: Counter[str] = Counter()
        self._member_of: dict[str, str] = {}
        self._pool_loads: dict[str, PoolLoads] = {}
        self._changed_meanwhile: set[str] | None = None  # while a rebuild runs: nodes whose counts changed
        self.rebuild(policy)

    # -- what changed (from ClusterState, under its lock) -----------------------------------------
    def rebuild(self, policy: PlacementPolicy, chunk: int | None = None) -> None:
        """Every pool's load index from the nodes, counts and figures (the policy changed).

        The new index is built off to the side, `chunk` nodes (HOLD_CHUNK) per hold of the lock, while
        admission's node choice goes on with the old one (#24); then it is put in place in one short hold,
        with the counts that changed on its nodes meanwhile (a placement assumed, one that expired) and
        the egress figures polled meanwhile. The nodes do not change meanwhile: ClusterState calls this
        under its own lock, which its node events take too."""
        chunk = chunk or HOLD_CHUNK
        count_assumed = self.balance == "load"
        building = {pool.name: PoolLoads(pool.capacity, count_assumed=count_assumed, egress=pool.egress_load)
                    for pool in policy.pools}
        member_of: dict[str, str] = {}
        with self._lock:
            figures = dict(self._egress)
            self._changed_meanwhile = set()
        for name, loads in building.items():
            if loads.egress is not None and name in figures:
                loads.set_figures(figures[name])
        nodes = list(self._nodes().items())
        for start in range(0, len(nodes), chunk):
            with self._lock:
                for name, node in nodes[start:start + chunk]:
                    pool = policy.pool_of(node) if node.ready and not node.unschedulable else None
                    if pool is not None:
                        member_of[name] = pool.name
                        building[pool.name].put(name, node.allocatable_pods, self._placed[name], self.ledger.assumed_on(name))
        with self._lock:
            for name in self._changed_meanwhile:
                if name in member_of:
                    building[member_of[name]].set_placed(name, self._placed[name])
                    building[member_of[name]].set_assumed(name, self.ledger.assumed_on(name))
            self._changed_meanwhile = None
            for name, loads in building.items():
                if loads.egress is not None and self._egress.get(name) is not figures.get(name):
                    loads.set_figures(self._egress.get(name) or {})
            self._policy, self._pool_loads, self._member_of = policy, building, member_of

    def node_changed(self, name: str, node: NodeState | None) -> None:
        """Node `name` changed (None: deleted): it joins, stays in or leaves its pool's index."""
        with self._lock:
            pool = self._policy.pool_of(node) if node is not None and node.ready and not node.unschedulable else None
            old = self._member_of.get(name)
            if old is not None and (pool is None or pool.name != old):
                self._pool_loads[old].remove(name)
                del self._member_of[name]
            if pool is not None and node is not None:
                self._member_of[name] = pool.name
                self._pool_loads[pool.name].put(name, node.allocatable_pods, self._placed[name], self.ledger.assumed_on(name))

    def pod_changed(self, obj: Mapping[str, Any], deleted: bool, old: PodState | None, new: PodState | None) -> None:
        with self._lock:
            self._claim(*self._pod_seen(obj, None if deleted else new or PodState.from_pod(obj)), self._clock())
            before, after = _place_taken(old), _place_taken(new)
            if before != after:  # most updates (status, annotations) leave the count where it was
                if before is not None:
                    self._count_placed(before, -1)
                if after is not None:
                    self._count_placed(after, 1)

    def count_pods(self, pods: Iterable[PodState], objs: Iterable[Mapping[str, Any]]) -> PodCounts:
        """A relist's counts, made off to the side (only the pod informer's thread writes pods)."""
        pods = list(pods)
        placed = Counter(node for node in map(_place_taken, pods) if node is not None)
        moved = {n for n in placed.keys() | self._placed.keys() if placed[n] != self._placed[n]}
        by_key = {ledger_key("pod", p.namespace, p.name): p for p in pods}
        seen = []
        for obj in objs:
            meta = obj["metadata"]
            pod = by_key.get(ledger_key("pod", meta.get("namespace") or "default", meta["name"]))
            seen.append(self._pod_seen(obj, pod or PodState.from_pod(obj)))  # a finished one too: it replaces its run
        return placed, moved, seen

    def pods_replaced(self, counts: PodCounts, chunk: int = HOLD_CHUNK) -> None:
        """A relist's counts (`count_pods`) in one hold, then its claims `chunk` pods per hold (`_replaced`)."""
        placed, moved, seen = counts
        with self._lock:
            self._placed = placed
            for node in moved:
                self._count_placed(node, 0)
        self._replaced("pod/", seen, chunk)

    def run_changed(self, kind: str, obj: Mapping[str, Any], deleted: bool) -> None:
        """A TaskRun or PipelineRun event: its decision record counts, or stops counting."""
        with self._lock:
            self._claim(*self._run_seen(kind, obj, deleted), self._clock())

    def runs_replaced(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A relist of `kind`'s runs."""
        self._replaced(f"{kind.lower()}/", [self._run_seen(kind, obj, False) for obj in objs])

    def _replaced(self, prefix: str, seen: list[PodSeen], chunk: int = HOLD_CHUNK) -> None:
        """The claim book after a relist of the keys under `prefix`: those not listed removed, each listed
        one seen. `chunk` keys per hold of the lock: at 20,000 pods one hold took ~8 ms, with admission's
        node choice waiting for it (#22). The book's counts do not depend on the order across keys, and each
        key's step is whole (a watch event does the same for one key); only the relist's own informer
        thread writes these keys meanwhile."""
        listed = {key for key, _ in seen}
        with self._lock:
            steps: list[PodSeen] = [(k, None) for k in self.claims.stored_keys() if k.startswith(prefix) and k not in listed]
        steps += seen
        for start in range(0, len(steps), chunk):
            with self._lock:
                now = self._clock()
                for key, version in steps[start:start + chunk]:
                    self._claim(key, version, now)

    def _claim(self, key: str, version: Seen | None, now: float) -> None:
        if version is None:
            self.claims.removed(key, now)
        else:
            self.claims.seen(version, now)

    def _pod_seen(self, obj: Mapping[str, Any], pod: PodState | None) -> PodSeen:
        """The pod as the claim book reads it (None: deleted). Its runs, from now on counted by the pod, not
        by themselves: the TaskRun it is the pod of (`queue.core.is_run_pod`: its controller owner resolves
        by uid to a cached, decided TaskRun whose status.podName, once set, is this pod), and the
        PipelineRun that TaskRun's controller owner resolves to by uid. No label is read: the
        `tekton.dev/*` labels are the TaskRun creator's to write (a pod labelled with another run's name
        settles nothing). A run not cached yet is settled by a later version of the pod, or by its own."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        key = ledger_key("pod", namespace, meta["name"])
        if pod is None:
            return key, None
        runs = []
        owner = claimed_taskrun(pod.owners)
        # Its runs were created before it: when it is older than the ttl, their records count no more anyway.
        created = parse_time(meta.get("creationTimestamp") or "") if owner is not None else None
        if owner is not None and (created is None or self._clock() - created <= self.assumption_ttl):
            taskrun = self._run("TaskRun", namespace, owner.name)
            if taskrun is not None and is_run_pod(owner, taskrun.uid, taskrun.decided, meta["name"], taskrun.pod_name):
                runs.append((ledger_key("taskrun", namespace, owner.name), owner.uid))
                whole = taskrun.pipelinerun
                cached = self._run("PipelineRun", namespace, whole.name) if whole is not None else None
                if whole is not None and cached is not None and cached.uid == whole.uid:
                    runs.append((ledger_key("pipelinerun", namespace, whole.name), whole.uid))
        active = pod.active and not pod.node_name
        return key, self._seen(key, meta, namespace, active, tuple(runs))

    def _run_seen(self, kind: str, obj: Mapping[str, Any], deleted: bool) -> PodSeen:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        key = ledger_key(kind.lower(), namespace, meta["name"])
        if deleted:
            return key, None
        annotations = meta.get("annotations") or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        done = any(isinstance(c, Mapping) and c.get("type") == "Succeeded" and c.get("status") in ("True", "False") for c in conditions)
        held = bool((obj.get("spec") or {}).get("status")) or QUEUE_ANNOTATION in annotations
        active = not (done or held or meta.get("deletionTimestamp"))
        # A pod of its own seen before it (informers of two kinds, a relist of pods first): the pod counts, not it.
        uid, pod_name = meta.get("uid") or "", (obj.get("status") or {}).get("podName")
        mine = active and bool(uid) and self._run_pod(kind, namespace, meta["name"], uid, pod_name if isinstance(pod_name, str) else "")
        return key, self._seen(key, meta, namespace, active, ((key, uid),) if mine else ())

    def _seen(self, key: str, meta: Mapping[str, Any], namespace: str, active: bool, runs: tuple[tuple[str, str], ...]) -> Seen:
        uid = meta.get("uid") or ""
        annotations = meta.get("annotations") or {}
        also: tuple[str, ...] = ()
        if meta.get("generateName") and (review := annotations.get(REVIEW_ANNOTATION)):
            # admitted before it had a name: this replica assumed it under generateName + the review's uid (read
            # from every version, held ones too: a held run settles admission's assumption of it as well)
            also = (ledger_key(key.split("/", 1)[0], namespace, f"{meta['generateName']}{review}"),)
        if not active or self.claims.knows(key, uid, self._clock()):  # nothing to read: the book keeps what it read
            return Seen(key, uid, -math.inf, None, active, runs, also)
        created = parse_time(meta.get("creationTimestamp") or "")
        claim = self._trusted_claim(namespace, annotations.get(DECISION_ANNOTATION))
        return Seen(key, uid, created if created is not None else self._clock(), claim, active, runs, also)

    def _trusted_claim(self, namespace: str, record: Any) -> tuple[str, str] | None:
        """(pool, node) of a decision record, when it could be admission's: the node is an eligible
        member of that pool, and the namespace may use the pool (not an exempt one)."""
        pool_name, node = decided_placement(record)
        if pool_name is None or node is None or self._member_of.get(node) != pool_name:
            return None
        pool = self._policy.pool(pool_name)
        if pool is None or namespace in self._policy.exempt_namespaces or not pool.allows(self._namespace(namespace)):
            return None
        return pool_name, node

    def _count_placed(self, node: str, change: int) -> None:
        if self._changed_meanwhile is not None:
            self._changed_meanwhile.add(node)
        self._placed[node] += change
        if self._placed[node] <= 0:
            del self._placed[node]
        pool = self._member_of.get(node)
        if pool is not None:
            self._pool_loads[pool].set_placed(node, self._placed[node])

    def _assumed_changed(self, node: str) -> None:
        """The ledger's count on `node` changed (it calls this, under the lock its caller holds)."""
        if self._changed_meanwhile is not None:
            self._changed_meanwhile.add(node)
        pool = self._member_of.get(node)
        if pool is not None:
            self._pool_loads[pool].set_assumed(node, self.ledger.assumed_on(node))

    # -- readers ------------------------------------------------------------------------------------
    def pool_names(self, pool: str) -> list[str]:
        """The pool's eligible nodes (members, Ready, not cordoned), by name."""
        with self._lock:
            loads = self._pool_loads.get(pool)
            return sorted(loads.names()) if loads is not None else []

    def pool_nodes(self, pool: Pool) -> list[NodeState]:
        """The pool's eligible nodes by name. O(n): for the egress pollers and `status`, not for a decision."""
        nodes = self._nodes()
        return [nodes[name] for name in self.pool_names(pool.name) if name in nodes]

    def placed_counts(self, nodes: Iterable[str]) -> dict[str, int]:
        """Active pods that take a run's place on each node (DaemonSet pods do not count)."""
        with self._lock:
            return {n: self._placed.get(n, 0) for n in nodes}

    def loads(self, pool: Pool) -> dict[str, NodeLoad]:
        """The load of each of the pool's eligible nodes (placed, assumed, capacity). O(n): for `status`,
        `explain` and tests; a decision reads only what `choose` reports."""
        with self._lock:
            self.claims.expire(self._clock())
            loads = self._pool_loads.get(pool.name)
            return loads.loads() if loads is not None else {}

    def set_egress_figures(self, pool: str, figures: Mapping[str, Measurement] | None, chunk: int = HOLD_CHUNK) -> None:
        """The measured egress throughput of `pool`'s nodes as last polled (a new mapping each poll,
        not changed after), or None when the pool has no source any more.

        The figures are taken in `chunk` nodes per hold of the lock (admission's node choice waits for
        it: a hold stays under a review's time, #24); a choice made meanwhile sees each node's figure of
        this poll or of the last, both measured."""
        with self._lock:
            if figures is None:
                self._egress.pop(pool, None)
            else:
                self._egress[pool] = figures
            loads = self._pool_loads.get(pool)
            if loads is None or loads.egress is None:
                return
            loads.refresh(self._clock())
            names = list(loads.names())
            loads.set_figures(figures or {}, ())  # a node that joins from now on reads these figures
        for start in range(0, len(names), chunk):
            with self._lock:
                if self._pool_loads.get(pool) is not loads:
                    return  # rebuilt meanwhile: the new index took the figures from self._egress
                loads.set_figures(figures or {}, names[start:start + chunk])

    def choose(
        self, pool: Pool, salt: str, shown: int = LOADS_SHOWN, allowed: frozenset[str] | None = None, prefer: str | None = None
    ) -> Choice:
        """The least-loaded node of `pool` now, assuming nothing (a dry run). O(log n) in the pool's size."""
        return self.choose_and_assume(pool, None, salt, shown, allowed, prefer)

    def choose_and_assume(
        self, pool: Pool, key: str | None, salt: str, shown: int = LOADS_SHOWN, allowed: frozenset[str] | None = None,
        prefer: str | None = None,
    ) -> Choice:
        """Pick the least-loaded node of `pool` and count the placement at once (so a burst spreads).

        The load is runs (placed + assumed) against capacity, combined with measured egress
        throughput when the pool has an egress source (`core.egress`). Returns the node (None when
        the pool has no eligible node) and the loads seen before this placement: the chosen node's
        and the least loaded others', at most `shown`. O(log n) in the pool's size. `key` None: assume nothing.
        `allowed`: choose only among these nodes (egress budgets: those whose address has room). `prefer`:
        that node among equally loaded ones (the node a run's pod was given with its run).
        """
        with self._lock:
            now = self._clock()
            self.claims.expire(now)
            loads = self._pool_loads.get(pool.name)
            if loads is None:
                return Choice(None)
            loads.refresh(now)  # egress figures judged at now
            node = loads.choose(salt, allowed, prefer)
            listed = loads.least_loaded(shown, include=node) if node is not None else []
            if node is not None and key is not None:
                self.claims.assume(key, pool.name, node, now)
            return Choice(node, {load.name: load for load in listed}, len(loads) - len(listed))

    def hand_over(self, run: str | None, pod: str | None = None) -> None:
        """A run's pod is being made (Pod CREATE): from now on the pod counts, the run's placement (`run`: its
        key, None for no run; `ClaimBook.forget`) does not, nor, while its node is chosen, the pod's own from
        an earlier call (`pod`: reinvocation; `ClaimBook.withdraw`). One hold of the lock."""
        with self._lock:
            now = self._clock()
            if run is not None:
                self.claims.forget(run, now)
            if pod is not None:
                self.claims.withdraw(pod, now)


def _place_taken(pod: PodState | None) -> str | None:
    """The node whose place `pod` takes (as a run): it is pending or running there, not being deleted,
    and no DaemonSet's. None when it takes none."""
    return pod.node_name if pod is not None and pod.node_name and pod.active and "DaemonSet" not in pod.owner_kinds else None
