"""The pool's load as the leader sees it, in metrics: one reconcile pass sets, for each pool node that
takes runs, `pool_node_load{pool, node, state}` (placed, assumed) and `pool_node_capacity{pool, node}`,
and for each pool `pool_ready_nodes{pool}`; series of nodes and pools no longer there are removed.

It reads the state in the leader's reconcile pass and at most every `min_interval` seconds, never per
admission: admission's cost does not grow with the number of pool nodes for the sake of a metric.
Admission's node choice waits for the load view's lock, so the loads are read `CHUNK` nodes per hold
(`pool_loads`), never the whole pool at once: `LoadView.loads` held it 72 ms at 5,000 pool nodes and
20,000 pods on a busy 2-core machine (2-4 ms alone), and reviews waited behind it. Prometheus scrapes
every 15 to 30 s anyway. Only the leader runs it; a replica that stops leading removes these series
(`Metrics.clear_leader_series`).
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Protocol

from controller.core.model import NodeLoad, NodeState
from controller.core.policy import PlacementPolicy, Pool
from controller.load.view import HOLD_CHUNK, LoadView
from controller.metrics import GaugeSnapshot, Metrics
from controller.runner import Pace, unpaced

PLACED, ASSUMED = "placed", "assumed"
CHUNK = HOLD_CHUNK  # pool nodes whose load is read per hold of the load view's lock


def pool_loads(load: LoadView, pool: Pool, nodes: Mapping[str, NodeState], chunk: int = CHUNK, paced: Pace = unpaced) -> dict[str, NodeLoad]:
    """What `load.loads(pool)` gives (each eligible node's placed, assumed and capacity), with the load
    view's lock held for at most `chunk` nodes at a time. A dry-run choice first drops the assumptions past
    their TTL, as `loads` does; the names are then read in one short hold, the placed counts `chunk` at a
    time, the assumed counts without the lock (one dict read each). Nodes that leave meanwhile are left out.
    `paced`: how the chunks are walked (between holds, the pass gives way to admission: runner.GiveWay)."""
    load.choose(pool, "")
    names = load.pool_names(pool.name)
    out: dict[str, NodeLoad] = {}
    for start in paced(range(0, len(names), chunk), every=1):
        part = [nodes[name] for name in names[start:start + chunk] if name in nodes]
        out.update(load.ledger.loads(part, load.placed_counts(n.name for n in part), pool.capacity))
    return out


class PoolLoads(Protocol):
    @property
    def policy(self) -> PlacementPolicy: ...

    load: LoadView

    @property
    def nodes(self) -> Mapping[str, NodeState]: ...


class PoolMetrics:
    def __init__(
        self, state: PoolLoads, metrics: Metrics, *, min_interval: float = 10.0, clock: Callable[[], float] = time.monotonic,
        paced: Pace = unpaced,
    ) -> None:
        self.state = state
        self.paced = paced
        self.min_interval = min_interval
        self.clock = clock
        self._last: float | None = None
        self._load = GaugeSnapshot(metrics.pool_node_load)
        self._capacity = GaugeSnapshot(metrics.pool_node_capacity)
        self._ready = GaugeSnapshot(metrics.pool_ready_nodes)

    def __call__(self) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.min_interval:
            return
        self._last = now
        load: dict[tuple[str, ...], float] = {}
        capacity: dict[tuple[str, ...], float] = {}
        ready: dict[tuple[str, ...], float] = {}
        nodes = self.state.nodes
        for pool in self.state.policy.pools:
            figures = pool_loads(self.state.load, pool, nodes, paced=self.paced)
            ready[(pool.name,)] = len(figures)
            for node, figure in self.paced(figures.items()):
                load[(pool.name, node, PLACED)] = figure.placed
                load[(pool.name, node, ASSUMED)] = figure.assumed
                capacity[(pool.name, node)] = figure.capacity
        self._load.set(load)
        self._capacity.set(capacity)
        self._ready.set(ready)
