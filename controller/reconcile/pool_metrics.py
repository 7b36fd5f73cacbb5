"""The pool's load as the leader sees it, in metrics: one reconcile pass sets, for each pool node that
takes runs, `pool_node_load{pool, node, state}` (placed, assumed) and `pool_node_capacity{pool, node}`,
and for each pool `pool_ready_nodes{pool}`; series of nodes and pools no longer there are removed.

It reads the state through the same readers node choice uses (`ClusterState.pool_nodes`, `loads`),
once per pass (after a change, at least every resync), never per admission: admission's cost does
not grow with the number of pool nodes for the sake of a metric. Only the leader runs it; a replica
that stops leading removes these series (`Metrics.clear_leader_series`).
"""

from __future__ import annotations

from typing import Mapping, Protocol

from controller.core.model import NodeLoad, NodeState
from controller.core.policy import PlacementPolicy, Pool
from controller.metrics import GaugeSnapshot, Metrics

PLACED, ASSUMED = "placed", "assumed"


class PoolLoads(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    def pool_nodes(self, pool: Pool) -> list[NodeState]: ...

    def loads(self, pool: Pool) -> Mapping[str, NodeLoad]: ...


class PoolMetrics:
    def __init__(self, state: PoolLoads, metrics: Metrics) -> None:
        self.state = state
        self._load = GaugeSnapshot(metrics.pool_node_load)
        self._capacity = GaugeSnapshot(metrics.pool_node_capacity)
        self._ready = GaugeSnapshot(metrics.pool_ready_nodes)

    def __call__(self) -> None:
        load: dict[tuple[str, ...], float] = {}
        capacity: dict[tuple[str, ...], float] = {}
        ready: dict[tuple[str, ...], float] = {}
        for pool in self.state.policy.pools:
            ready[(pool.name,)] = len(self.state.pool_nodes(pool))
            for node, figure in self.state.loads(pool).items():
                load[(pool.name, node, PLACED)] = figure.placed
                load[(pool.name, node, ASSUMED)] = figure.assumed
                capacity[(pool.name, node)] = figure.capacity
        self._load.set(load)
        self._capacity.set(capacity)
        self._ready.set(ready)
