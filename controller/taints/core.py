"""The taint plan: which owned taints each node must gain or lose so that exactly the members of a
pool carry that pool's taint. Owned taints are those with egress-placer's fixed key
(`egress-placer.io/pool`, any value or effect), whatever pools the policy has now: a valid policy
without a pool, or with no pools at all, removes that pool's taints. Foreign taints (any other key)
are never touched.

Only a valid policy is planned for: with none in force (none ever loaded, none stored) the caller
plans nothing and the taints stay (controller/taints/reconcile.py).

Level-based: plan from the nodes as they are, apply, plan again: nothing left to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controller.core.model import NodeState, Taint
from controller.core.policy import PlacementPolicy


@dataclass(frozen=True)
class TaintChange:
    """Owned taints to remove from and add to one node."""

    node: str
    add: tuple[Taint, ...]
    remove: tuple[Taint, ...]

    def apply(self, taints: Sequence[Taint]) -> tuple[Taint, ...]:
        """The node's new taint list: `taints` minus `remove` (order kept), then `add` not yet present."""
        kept = [t for t in taints if t not in self.remove]
        return (*kept, *(t for t in dict.fromkeys(self.add) if t not in kept))


def desired_taints(node: NodeState, policy: PlacementPolicy) -> tuple[Taint, ...]:
    """The owned taints `node` must carry: its pool's taint, or none outside every pool."""
    pool = policy.pool_of(node)
    return (pool.taint_for(),) if pool is not None else ()


def plan_taints(policy: PlacementPolicy, nodes: Iterable[NodeState]) -> list[TaintChange]:
    """One change per node whose owned taints differ from the desired ones, in input order.

    An owned taint (key in `policy.owned_taint_keys()`) that is not exactly desired is removed
    (a node that left its pool, a pool the policy no longer has, a wrong value or effect); a desired
    taint missing is added.
    """
    owned = policy.owned_taint_keys()
    changes = []
    for node in nodes:
        desired = desired_taints(node, policy)
        remove = tuple(dict.fromkeys(t for t in node.taints if t.key in owned and t not in desired))
        add = tuple(t for t in desired if t not in node.taints)
        if add or remove:
            changes.append(TaintChange(node=node.name, add=add, remove=remove))
    return changes
