"""Prometheus metrics of egress-placer, in one registry that the app serves on /metrics.

Built per process (no module-level singletons): `Metrics()` makes a fresh registry, so tests and
benchmarks can make as many as they like. Grouped by who records them: admission, the pool
(load, taints, intruders), and the adapters (watches, API calls, Events, the policy, the lease).
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ADMISSION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._admission()
        self._pool()
        self._adapters()

    def _counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(f"egress_placer_{name}", help, list(labels), registry=self.registry)

    def _gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(f"egress_placer_{name}", help, list(labels), registry=self.registry)

    def _admission(self) -> None:
        self.decisions = self._counter(
            "decisions_total", "Placement decisions, by admitted kind, reason and pool.", ["kind", "reason", "pool"]
        )
        self.admission_seconds = Histogram(
            "egress_placer_admission_duration_seconds",
            "Time to answer one AdmissionReview, by kind.",
            ["kind"],
            buckets=ADMISSION_BUCKETS,
            registry=self.registry,
        )
        self.admission_errors = self._counter(
            "admission_errors_total",
            "AdmissionReviews answered with an error or allowed unchanged because of an internal error.",
            ["kind"],
        )

    def _pool(self) -> None:
        self.pool_node_load = self._gauge(
            "pool_node_load",
            "Runs counted on a pool node: placed (pending or running) and assumed (admitted, pod not seen yet).",
            ["pool", "node", "state"],
        )
        self.pool_node_capacity = self._gauge(
            "pool_node_capacity", "Runs a pool node takes before it counts as full.", ["pool", "node"]
        )
        self.taint_changes = self._counter(
            "taint_changes_total", "Taints added or removed on pool nodes.", ["pool", "action"]
        )
        self.evictions = self._counter(
            "intruder_evictions_total",
            "Intruder pods found on pool nodes, by pool and outcome (evicted, reported, deferred by a PodDisruptionBudget, deleted after the budget grace, failed).",
            ["pool", "outcome"],
        )

    def _adapters(self) -> None:
        self.watch_restarts = self._counter(
            "watch_restarts_total", "Watches restarted, by resource and cause.", ["resource", "cause"]
        )
        self.policy_reloads = self._counter(
            "policy_reloads_total", "Policy loads, by result (loaded, refused).", ["result"]
        )
        self.policy_valid = self._gauge(
            "policy_valid", "1 when the last policy seen was valid, 0 when it was refused."
        )
        self.api_write_retries = self._counter(
            "api_write_retries_total", "API writes retried, by operation and cause.", ["operation", "cause"]
        )
        self.events_dropped = self._counter(
            "events_dropped_total", "Kubernetes Events not sent because the queue was full."
        )
        self.is_leader = self._gauge("leader", "1 while this replica holds the leader lease.")
