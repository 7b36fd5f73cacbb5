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
            "Steps taken against intruder pods on pool nodes, by pool and outcome: evicted, deferred (a "
            "PodDisruptionBudget refused), deleted-past-budget-grace (refused for the whole budget grace), "
            "deleted-after-grace (still there once the eviction's grace was over: deleted with grace 0), "
            "reported (report mode), failed.",
            ["pool", "outcome"],
        )
        self.agent_tolerations_added = self._counter(
            "agent_tolerations_added_total",
            "DaemonSet pod templates of agent namespaces given the pool tolerations, by who: admission "
            "(CREATE, or an UPDATE that changes the template) or leader (an existing one, opted in).",
            ["by"],
        )
        self.agents_missing = self._gauge(
            "agent_pool_nodes_missing",
            "Pool nodes a node agent (DaemonSet of an agent namespace) targets but has no pod on, because its "
            "pod template does not tolerate the pool taint.",
            ["namespace", "daemonset"],
        )
        self.intruders_removed = self._counter(
            "intruders_removed_total",
            "Intruder pods gone from their pool node, by pool and the step that removed them: evicted, "
            "deleted-after-grace, deleted-past-budget-grace, or left (gone before any step, or by itself).",
            ["pool", "step"],
        )
        self.intruder_clear_seconds = Histogram(
            "egress_placer_intruder_clear_seconds",
            "Seconds from finding an intruder on a pool node to its being gone, by pool.",
            ["pool"],
            buckets=(0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300),
            registry=self.registry,
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
