"""The load picture node choice reads, kept current on events so that no decision rebuilds it: pods
counted per node, the pool each eligible node belongs to, one load index per pool (`load.index`),
the assumption ledger (`load.core.LoadLedger`) and the measured egress figures.

ClusterState feeds it (policy, node and pod changes); admission asks it (`choose_and_assume`). It has
a lock of its own: a relist of any other kind never holds it, one of pods or nodes only for its swap.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from controller.core.egress import Measurement
from controller.core.images import TASKRUN_LABEL
from controller.core.model import NodeLoad, NodeState, PodState
from controller.core.policy import PlacementPolicy, Pool
from controller.load.core import LoadLedger, ledger_key
from controller.load.index import PoolLoads

LOADS_SHOWN = 10  # nodes whose load a choice reports: the chosen one and the least loaded others
PodCounts = tuple[Counter[str], set[str], list[str]]  # a relist's counts: placed per node, nodes moved, keys settled


@dataclass(frozen=True)
class Choice:
    """A node choice and the load picture it saw (before the placement it made)."""

    node: str | None
    # The chosen node's load and the least loaded others', at most LOADS_SHOWN (shown): not every
    # node's, so a choice costs the same in a pool of 10 nodes or 10,000.
    loads: Mapping[str, NodeLoad] = field(default_factory=dict)
    more_nodes: int = 0  # eligible nodes of the pool not in `loads`


class LoadView:
    """`nodes()`: the node store's items now. `balance` (Settings.balance): "load" counts assumed
    placements; "load-without-assumptions" only seen pods."""

    def __init__(self, policy: PlacementPolicy, nodes: Callable[[], Mapping[str, NodeState]],
                 clock: Callable[[], float], assumption_ttl: float, balance: str) -> None:
        self._lock = threading.RLock()
        self._nodes, self._clock, self.assumption_ttl, self.balance = nodes, clock, assumption_ttl, balance
        self.ledger = LoadLedger(on_change=self._assumed_changed)
        self._egress: dict[str, Mapping[str, Measurement]] = {}  # pool -> measured egress, as last polled
        self._placed: Counter[str] = Counter()
        self._member_of: dict[str, str] = {}
        self._pool_loads: dict[str, PoolLoads] = {}
        self.rebuild(policy)

    # -- what changed (from ClusterState, under its lock) -----------------------------------------
    def rebuild(self, policy: PlacementPolicy) -> None:
        """Every pool's load index from the nodes, counts and figures (the policy, or every node, changed)."""
        with self._lock:
            self._policy = policy
            count_assumed = self.balance == "load"
            self._pool_loads = {pool.name: PoolLoads(pool.capacity, count_assumed=count_assumed, egress=pool.egress_load)
                                for pool in policy.pools}
            for name, loads in self._pool_loads.items():
                if loads.egress is not None and name in self._egress:
                    loads.set_figures(self._egress[name])
            self._member_of = {}
            for name, node in self._nodes().items():
                self.node_changed(name, node)

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
            if not deleted:
                for key in _settled_by(obj):
                    self.ledger.settle(key)
            before, after = _place_taken(old), _place_taken(new)
            if before != after:  # most updates (status, annotations) leave the count where it was
                if before is not None:
                    self._count_placed(before, -1)
                if after is not None:
                    self._count_placed(after, 1)

    def count_pods(self, pods: Iterable[PodState], objs: Iterable[Mapping[str, Any]]) -> PodCounts:
        """A relist's counts, made off to the side (only the pod informer's thread writes pods)."""
        placed = Counter(node for node in map(_place_taken, pods) if node is not None)
        moved = {n for n in placed.keys() | self._placed.keys() if placed[n] != self._placed[n]}
        return placed, moved, [key for obj in objs for key in _settled_by(obj) if key in self.ledger]

    def pods_replaced(self, counts: PodCounts) -> None:
        with self._lock:
            self._placed, moved, settled = counts
            for node in moved:
                self._count_placed(node, 0)
            for key in settled:
                self.ledger.settle(key)

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
            now = self._clock()
            self.ledger.expire(now, self.assumption_ttl)
            loads = self._pool_loads.get(pool.name)
            if loads is None:
                return Choice(None)
            loads.refresh(now)  # egress figures judged at now
            node = loads.choose(salt)
            listed = loads.least_loaded(shown, include=node) if node is not None else []
            if node is not None and key is not None:
                self.ledger.assume(key, pool.name, node, now)
            return Choice(node, {load.name: load for load in listed}, len(loads) - len(listed))

    def forget(self, key: str) -> None:
        with self._lock:
            self.ledger.settle(key)


def _place_taken(pod: PodState | None) -> str | None:
    """The node whose place `pod` takes (as a run): it is pending or running there, not being deleted,
    and no DaemonSet's. None when it takes none."""
    return pod.node_name if pod is not None and pod.node_name and pod.active and "DaemonSet" not in pod.owner_kinds else None


def _settled_by(obj: Mapping[str, Any]) -> list[str]:
    """The assumptions a pod bound to a node settles: from now on the pod itself is counted (or,
    finished, nothing is): its own and its TaskRun's."""
    if not (obj.get("spec") or {}).get("nodeName"):
        return []
    meta = obj["metadata"]
    namespace, taskrun = meta.get("namespace") or "default", (meta.get("labels") or {}).get(TASKRUN_LABEL)
    return [ledger_key("pod", namespace, meta["name"])] + ([ledger_key("taskrun", namespace, taskrun)] if taskrun else [])
