"""Reference answers the product's faster paths are held to (tests/unit and bench/core.py call them; the
controller does not).

`choose_node` is the full scan over a pool's nodes that `load.index.PoolLoads` (what admission
uses) must agree with; `eligible_nodes` the members of a pool a run may be sent to now, as the state's
per-pool load index holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controller.load.core import Rank, load_rank, spread_index
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


def choose_node(
    nodes: Sequence[NodeState],
    loads: Mapping[str, NodeLoad],
    *,
    salt: str,
    ratios: Mapping[str, float] | None = None,
) -> str | None:
    """The name of the node with the lowest load ratio among `nodes`, or None when there is none.

    The full scan: every node is ranked. It is the reference `PoolLoads` (load.index), which
    admission uses, must agree with; the controller does not call it.

    Order (`load_rank`): ratio (placed+assumed)/capacity, then the absolute count; a node with
    capacity <= 0 comes last. Among the nodes of the lowest rank (ties), the one at
    `spread_index(salt, count)` in name order, so equal nodes are picked in a salt-dependent order.
    A node missing from `loads` has no load and the capacity of its allocatable pods. Full nodes
    (ratio >= 1) sort after every non-full one but are still chosen when all are full: the pool
    constraint stays and the scheduler decides.

    `ratios`, when given (measured egress load), replaces the ratio of every node it names that
    has capacity, compared exactly as the floats given; the absolute count and the tie rule still
    order equal ratios.
    """
    if not nodes:
        return None
    ranks: dict[str, Rank] = {}
    for node in nodes:
        load = loads.get(node.name) or NodeLoad(node.name, 0, 0, node.allocatable_pods)
        measured = None
        if ratios is not None and node.name in ratios and load.capacity > 0:
            measured = ratios[node.name].as_integer_ratio()
        ranks[node.name] = load_rank(load, measured)
    best = min(ranks.values())
    tied = sorted(name for name, rank in ranks.items() if rank == best)
    return tied[spread_index(salt, len(tied))]
