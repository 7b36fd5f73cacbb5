"""Node choice inside a pool: the least loaded eligible node, and the bookkeeping of placements
chosen at admission whose pods do not exist yet.

Pure: the clock is passed in, nothing here reads the cluster.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from controller.core.model import NodeLoad, NodeState
from controller.core.policy import PlacementPolicy, Pool


def eligible_nodes(pool: Pool, policy: PlacementPolicy, nodes: Iterable[NodeState]) -> list[NodeState]:
    """The nodes of `pool` a run may be sent to now: members (per `policy.pool_of`), Ready, not cordoned.

    Membership is compared by pool name, so a `pool` taken from an equal policy object works too.
    """
    out = []
    for node in nodes:
        if not node.ready or node.unschedulable:
            continue
        owner = policy.pool_of(node)
        if owner is not None and owner.name == pool.name:
            out.append(node)
    return out


def _load_rank(load: NodeLoad) -> tuple[bool, Fraction, int]:
    """(no capacity, exact ratio placed+assumed / capacity, absolute count): lower is better.
    A node with capacity 0 or less sorts after every node that has some."""
    if load.capacity <= 0:
        return (True, Fraction(0), load.total)
    return (False, Fraction(load.total, load.capacity), load.total)


def _tie_break(salt: str, node: str) -> bytes:
    """A stable (process-independent) pseudo-random rank of `node` for this `salt`."""
    return hashlib.blake2b(f"{salt}\0{node}".encode(), digest_size=8).digest()


def choose_node(
    nodes: Sequence[NodeState],
    loads: Mapping[str, NodeLoad],
    *,
    salt: str,
    ratios: Mapping[str, float] | None = None,
) -> str | None:
    """The name of the node with the lowest load ratio among `nodes`, or None when there is none.

    Order: ratio (placed+assumed)/capacity, then the absolute count, then a hash of salt+name, so
    equal nodes are picked in a salt-dependent order; a node with capacity <= 0 comes last. A node
    missing from `loads` has no load and the capacity of its allocatable pods. Full nodes
    (ratio >= 1) sort after every non-full one but are still chosen when all are full: the pool
    constraint stays and the scheduler decides.

    `ratios`, when given (measured egress load, `core.egress.rank_nodes`), replaces the ratio of
    every node it names; the absolute count and the tie-break still order equal ratios.
    """

    def rank(node: NodeState) -> tuple[tuple[bool, Fraction, int], bytes, str]:
        load = loads.get(node.name) or NodeLoad(node.name, 0, 0, node.allocatable_pods)
        no_capacity, ratio, total = _load_rank(load)
        if ratios is not None and node.name in ratios and not no_capacity:
            ratio = Fraction(ratios[node.name]).limit_denominator(10**9)
        return ((no_capacity, ratio, total), _tie_break(salt, node.name), node.name)

    if not nodes:
        return None
    return min(nodes, key=rank).name


def ledger_key(kind: str, namespace: str, name: str) -> str:
    """The key convention of `LoadLedger`: "<kind>/<namespace>/<name>", kind "taskrun" or "pod"."""
    return f"{kind}/{namespace}/{name}"


@dataclass(frozen=True)
class Assumption:
    """A placement chosen at admission whose pod the informer has not seen yet."""

    pool: str
    node: str
    since: float


class LoadLedger:
    """Placements assumed at admission, counted on their node until their pod appears.

    Keys are opaque strings; by convention `ledger_key(kind, namespace, name)`: "taskrun/ns/name"
    when a TaskRun is admitted (settled when a pod labelled `tekton.dev/taskRun=name` appears in
    ns) and "pod/ns/name" when a Pod is admitted (settled when the informer sees that pod). The
    caller that assumes a key must settle it with the same key; whatever is never settled is
    dropped by `expire`. Assuming a key again moves it (never counted twice).

    Not thread-safe: one event loop (or one lock) owns a ledger.
    """

    def __init__(self) -> None:
        self._assumed: dict[str, Assumption] = {}
        self._per_node: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._assumed)

    def __contains__(self, key: object) -> bool:
        return key in self._assumed

    def get(self, key: str) -> Assumption | None:
        return self._assumed.get(key)

    def assume(self, key: str, pool: str, node: str, now: float) -> None:
        """Count one placement on `node` until `key` is settled or expires."""
        self.settle(key)
        self._assumed[key] = Assumption(pool=pool, node=node, since=now)
        self._per_node[node] += 1

    def settle(self, key: str) -> None:
        """The pod of `key` appeared (the informer counts it now) or will never come. Unknown keys are ignored."""
        old = self._assumed.pop(key, None)
        if old is not None:
            self._per_node[old.node] -= 1
            if self._per_node[old.node] <= 0:
                del self._per_node[old.node]

    def expire(self, now: float, ttl: float) -> list[str]:
        """Drop and return (sorted) the keys assumed more than `ttl` seconds before `now`."""
        stale = sorted(k for k, a in self._assumed.items() if now - a.since > ttl)
        for key in stale:
            self.settle(key)
        return stale

    def assumed_on(self, node: str) -> int:
        return self._per_node.get(node, 0)

    def loads(self, nodes: Sequence[NodeState], placed: Mapping[str, int], capacity: int | None) -> dict[str, NodeLoad]:
        """The load of each node: `placed` pods (from the informer), assumed placements, and
        `capacity` (the pool's setting) or, when None, the node's allocatable pods."""
        return {
            n.name: NodeLoad(
                name=n.name,
                placed=placed.get(n.name, 0),
                assumed=self.assumed_on(n.name),
                capacity=capacity if capacity is not None else n.allocatable_pods,
            )
            for n in nodes
        }
