"""Prometheus metrics of egress-placer, in one registry that the app serves on /metrics.

Built per process (no module-level singletons): `Metrics()` makes a fresh registry, so tests and
benchmarks can make as many as they like.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "egress_placer_decisions_total",
            "Placement decisions, by admitted kind, reason and pool.",
            ["kind", "reason", "pool"],
            registry=r,
        )
        self.admission_seconds = Histogram(
            "egress_placer_admission_duration_seconds",
            "Time to answer one AdmissionReview, by kind.",
            ["kind"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.admission_errors = Counter(
            "egress_placer_admission_errors_total",
            "AdmissionReviews answered with an error or allowed unchanged because of an internal error.",
            ["kind"],
            registry=r,
        )
        self.pool_node_load = Gauge(
            "egress_placer_pool_node_load",
            "Runs counted on a pool node: placed (pending or running) and assumed (admitted, pod not seen yet).",
            ["pool", "node", "state"],
            registry=r,
        )
        self.pool_node_capacity = Gauge(
            "egress_placer_pool_node_capacity", "Runs a pool node takes before it counts as full.", ["pool", "node"], registry=r
        )
        self.taint_changes = Counter(
            "egress_placer_taint_changes_total", "Taints added or removed on pool nodes.", ["pool", "action"], registry=r
        )
        self.evictions = Counter(
            "egress_placer_intruder_evictions_total",
            "Intruder pods found on pool nodes, by pool and outcome (evicted, reported, deferred by a PodDisruptionBudget, deleted after the budget grace, failed).",
            ["pool", "outcome"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "egress_placer_watch_restarts_total", "Watches restarted, by resource and cause.", ["resource", "cause"], registry=r
        )
        self.policy_reloads = Counter(
            "egress_placer_policy_reloads_total", "Policy loads, by result (loaded, refused).", ["result"], registry=r
        )
        self.policy_valid = Gauge(
            "egress_placer_policy_valid", "1 when the last policy seen was valid, 0 when it was refused.", registry=r
        )
        self.api_write_retries = Counter(
            "egress_placer_api_write_retries_total", "API writes retried, by operation and cause.", ["operation", "cause"], registry=r
        )
        self.events_dropped = Counter(
            "egress_placer_events_dropped_total", "Kubernetes Events not sent because the queue was full.", registry=r
        )
        self.is_leader = Gauge("egress_placer_leader", "1 while this replica holds the leader lease.", registry=r)
