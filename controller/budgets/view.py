"""Egress budgets as the stores show them (docs/budgets.md): one pool's `PoolBudgets` now, and the lines
`egress-placer status` prints.

Counts come only from controller-trusted facts: the pod store's "budgeted" index (pods carrying a
budget record, by the pool it names: `budgets.core.read_record`), each pod a run's pod by uid
(`QueueView.is_run_pod`), counted on the node it is bound to (else the node admission chose), whose
egress address is the node's own (label, or the node's name). A pod the cache no longer keeps (finished)
no longer counts at once; its start stays in the window only through the leader's start record (not
built yet: docs/budgets.md, "What is built, what is next").
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, Sequence

from controller.budgets.core import (
    BUDGETS_ANNOTATION,
    PoolBudgets,
    Start,
    address_of,
    addresses,
    describe,
    figures,
    read_record,
    release_within,
    trusted_use,
)
from controller.core.model import PodState
from controller.core.policy import PlacementPolicy, Pool
from controller.load.view import LoadView
from controller.queue.view import QueueView
from controller.store import Store


def budgeted(pod: PodState) -> str | None:
    """The pod store's "budgeted" index: the pool a pod's budget record names (a claim until the view
    checks it is a run's pod)."""
    record = read_record(pod.annotations.get(BUDGETS_ANNOTATION))
    return record.pool if record is not None else None


class BudgetsView:
    def __init__(self, stores: Mapping[str, Store[Any, Any]], load: LoadView, queue: QueueView, policy: Callable[[], PlacementPolicy]) -> None:
        self._stores, self._load, self._queue, self._policy = stores, load, queue, policy

    def addresses(self, pool: Pool) -> dict[str, str]:
        """node -> egress address, for the pool's eligible nodes (members, Ready, not cordoned)."""
        nodes = self._stores["Node"].items
        return {n: address_of(n, nodes[n].labels, {}, pool.egress_address) for n in self._load.pool_names(pool.name) if n in nodes}

    def pool_budgets(self, pool: Pool) -> PoolBudgets | None:
        """The pool's budgets now; None when it has no destinations. O(pods carrying a record of the pool)."""
        if not pool.destinations:
            return None
        where = self.addresses(pool)
        nodes = self._stores["Node"].items
        known = [d.name for d in pool.destinations]
        uses, starts = [], []
        for pod in self._stores["Pod"].snapshot.under("budgeted", pool.name).values():
            record = read_record(pod.annotations.get(BUDGETS_ANNOTATION))
            use = trusted_use(pod.uid, record, pod.active and self._queue.is_run_pod(pod.namespace, pod.owners), pool.name, pod.node_name, known)
            if use is None or record is None:
                continue
            uses.append(use)
            node = nodes.get(use.node)
            address = where.get(use.node) or address_of(use.node, node.labels if node else {}, {}, pool.egress_address)
            starts += [Start(name, address, record.started) for name in sorted(use.destinations)]
        return PoolBudgets(pool.name, pool.destinations, where, tuple(uses), tuple(starts))

    def releasable(self, pool: Pool, line: Sequence[tuple[Hashable, Sequence[str]]], flying: Sequence[Sequence[str]], now: float) -> set[Hashable]:
        """Which of the waiting runs (`line`: key and the destinations each waits for, in release order) fit
        the pool's budgets now, with the runs released and not yet on a node (`flying`) counted. Every key
        when the pool has no destinations."""
        budgets = self.pool_budgets(pool)
        if budgets is None:
            return {key for key, _ in line}
        return set(release_within(budgets, line, flying, now))

    def status_lines(self, now: float) -> list[str]:
        """Each budget's use per pool, destination and address (`egress-placer status`)."""
        lines: list[str] = []
        for pool in self._policy().pools:
            budgets = self.pool_budgets(pool)
            if budgets is None:
                continue
            lines.append(f"pool {pool.name}: {len(budgets.addresses)} nodes behind {len(addresses(budgets))} egress addresses")
            for d in pool.destinations:
                shown = figures(budgets, d, None, now) + [f for a in addresses(budgets) for f in figures(budgets, d, a, now)]
                for f in shown:
                    mark = " (full)" if f.full else ""
                    mode = "" if d.enforced else f" [{d.mode}]"
                    lines.append(f"  {describe(f, pool.name).removeprefix('budget ')}{mark}{mode}")
        return lines
