"""How big each benchmark is, per mode: `quick` (a few minutes), `full` (the sizes users asked
about, well under 30 minutes) and `tiny` (seconds of work per section, for the test that checks
the output's shape)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    name: str
    # 1. Admission over HTTPS: seconds measured per point (after `http_warmup`), closed-loop
    # concurrencies, open-loop offered rates (requests/s), and the rate the p99 target is read at.
    http_seconds: float
    http_warmup: float
    http_repeats: int  # each point runs this many times per target, alternating; medians are kept
    concurrencies: tuple[int, ...]
    rates: tuple[int, ...]
    headline_rate: int
    # ... read from its own runs: `headline_repeats` short open-loop runs per target, alternating; medians.
    headline_repeats: int
    headline_seconds: float
    # 2. Decision core: pool sizes and seconds per size.
    core_pool_nodes: tuple[int, ...]
    core_seconds: float
    # 3. Balance: bursts as (TaskRuns, pool nodes); the egress case's burst (on the 3-node pool, one
    # node's link nearly full, measured by Prometheus).
    bursts: tuple[tuple[int, int], ...]
    egress_burst: int
    # 4. Scale: Node objects, Pods bound to them, pods on pool nodes whose change is timed.
    scale_nodes: int
    scale_pods: int
    scale_event_pods: int
    # 5. End to end: TaskRuns per mode (with / without the webhook), blocks per mode, runs/s. The blocks are
    # what e2e.call_latency's bootstrap draws from: 4 (quick) and 8 (full) per mode.
    e2e_runs: int
    e2e_blocks: int
    e2e_rate: float
    # Ordinary (non-pool) KWOK nodes of the bench cluster.
    ordinary_nodes: int = 2
    # 3. Balance with 1, 2 and 3 replicas (bench/balance_replicas.py): TaskRuns per burst on the largest pool.
    replica_burst: int = 300
    # 4. Scale, memory after the first sync (in-process, no cluster): TaskRuns beside scale_nodes and scale_pods.
    scale_taskruns: int = 0

    @property
    def pool_sizes(self) -> tuple[int, ...]:
        """Distinct pool sizes the bursts need, ascending (one pool per size)."""
        return tuple(sorted({k for _, k in self.bursts}))


SIZES: dict[str, Sizes] = {
    "quick": Sizes(
        name="quick",
        http_seconds=1.5,
        http_warmup=0.5,
        http_repeats=3,
        concurrencies=(1, 4, 16, 32),
        rates=(100, 200, 400, 600, 800),
        headline_rate=200,
        headline_repeats=5,
        headline_seconds=1.5,
        core_pool_nodes=(10, 100, 1000, 10000),
        core_seconds=1.5,
        bursts=((60, 3), (60, 10)),
        egress_burst=30,
        scale_nodes=500,
        scale_pods=2000,
        scale_event_pods=300,
        scale_taskruns=2000,
        replica_burst=100,
        e2e_runs=40,
        e2e_blocks=4,
        e2e_rate=5.0,
    ),
    "full": Sizes(
        name="full",
        http_seconds=5.0,
        http_warmup=1.0,
        http_repeats=3,
        concurrencies=(1, 4, 16, 32),
        rates=(100, 200, 400, 600, 800, 1000, 1200),
        headline_rate=200,
        headline_repeats=9,
        headline_seconds=2.0,
        core_pool_nodes=(10, 100, 1000, 10000),
        core_seconds=4.0,
        bursts=((60, 3), (60, 10), (300, 3), (300, 10)),
        egress_burst=60,
        scale_nodes=5000,
        scale_pods=20000,
        scale_event_pods=2000,
        scale_taskruns=20000,
        e2e_runs=480,
        e2e_blocks=16,
        e2e_rate=5.0,
    ),
    "tiny": Sizes(
        name="tiny",
        http_seconds=0.5,
        http_warmup=0.2,
        http_repeats=1,
        concurrencies=(1, 4),
        rates=(100, 200),
        headline_rate=200,
        headline_repeats=1,
        headline_seconds=0.5,
        core_pool_nodes=(10, 100),
        core_seconds=0.2,
        bursts=((6, 3),),
        egress_burst=6,
        scale_nodes=20,
        scale_pods=60,
        scale_event_pods=10,
        scale_taskruns=60,
        replica_burst=12,
        e2e_runs=4,
        e2e_blocks=1,
        e2e_rate=5.0,
        ordinary_nodes=1,
    ),
}
