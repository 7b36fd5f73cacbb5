"""Prometheus metrics of egress-placer, in one registry that the app serves on /metrics.

Built per process (no module-level singletons): `Metrics()` makes a fresh registry, so tests and
benchmarks can make as many as they like. Grouped by who records them: admission, the pool
(load, taints, intruders: the leader's reconcile pass), the adapters (watches, API calls, Events,
the policy, the lease, the serving certificate), and the process (build info, prometheus_client's
process, platform and garbage-collector collectors).

docs/metrics.md lists every series with its type, labels and who sets it; tests/unit/test_metrics.py
holds the same list as a table and checks the exposition against it.

Series only the leader sets (`LEADER_SERIES`) are removed when it stops leading (`clear_leader_series`):
a follower exports none, so a sum over replicas counts each pool node once.
"""

from __future__ import annotations

import platform
from typing import Any, Callable, Iterator, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily

from controller import __version__

# No `<counter>_created` gauge beside every counter and histogram (prometheus_client's default in the
# text format): Prometheus reads them as more series and nothing here uses them. A process-wide switch.
disable_created_metrics()

ADMISSION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
# The outcomes of one AdmissionReview (admission_reviews_total{outcome}).
MUTATED, UNCHANGED, ERROR, MALFORMED = "mutated", "unchanged", "error", "malformed"
UNKNOWN_KIND = "unknown"  # the kind label of a review whose body could not be read
# The attributes of Metrics that only the leader's reconcile pass sets.
LEADER_SERIES = (
    "pool_node_load", "pool_node_capacity", "pool_ready_nodes", "intruders", "taint_drift_nodes", "agents_missing",
    "queue_length", "queue_slots", "queue_over_cap_pods", "budget_in_use", "budget_window_starts",
)
QUEUE_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._process()
        self._admission()
        self._pool()
        self._queue()
        self._budgets()
        self._history()
        self._adapters()

    def _counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(f"egress_placer_{name}", help, list(labels), registry=self.registry)

    def _gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(f"egress_placer_{name}", help, list(labels), registry=self.registry)

    def _process(self) -> None:
        self.build_info = Info("egress_placer_build", "The running egress-placer: version and Python.", registry=self.registry)
        self.build_info.info({"version": __version__, "python_version": platform.python_version()})
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)  # python_gc_objects_collected_total, ...

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
        self.admission_reviews = self._counter(
            "admission_reviews_total",
            "AdmissionReviews answered, by kind (TaskRun, PipelineRun, Pod, DaemonSet, EgressPool, "
            "EgressPlacerConfig, other; unknown when the body could not be read) and outcome: mutated (a patch), "
            "unchanged (allowed as sent), allowed and denied (the pools API's validating webhook), error (an "
            "internal error: placement admits unchanged, fail-open; the pools API denies, fail-closed), "
            "malformed (refused with 400, 408 or 413: not an AdmissionReview, too large, or too slow to arrive).",
            ["kind", "outcome"],
        )
        self.admission_turned_away = self._counter(
            "admission_turned_away_total",
            "Webhook requests answered 503 before their body was read (the API server then applies the "
            "webhook's failurePolicy), by reason: busy (all ordinary slots taken), large-busy (large-review slots "
            "and their queue full), large-waited (a large review waited for a slot past the webhook timeout).",
            ["reason"],
        )

        self.owner_reads = self._counter(
            "admission_owner_reads_total",
            "TaskRuns read from the API server while a Pod review waited (a pod claiming a TaskRun the cache "
            "lacks, knows with another uid or pod, or holds pending), by outcome: found, absent (not found, or the "
            "read failed: the pod is no run's pod), timeout (not read within the bound: the same).",
            ["outcome"],
        )
        self.webhook_connections = self._counter(
            "webhook_connections_total",
            "Connections accepted by the webhook's HTTPS server (each a TLS handshake the API server waits for), "
            "and those closed by recycling (connection_max_requests / connection_max_seconds), by event: opened, "
            "recycled.",
            ["event"],
        )

    def _pool(self) -> None:
        self.pool_node_load = self._gauge(
            "pool_node_load",
            "Runs counted on a pool node that takes runs, by state: placed (pending or running) and assumed "
            "(admitted, pod not seen yet), as the leader's last reconcile pass saw them.",
            ["pool", "node", "state"],
        )
        self.pool_node_capacity = self._gauge(
            "pool_node_capacity", "Runs a pool node takes before it counts as full (the leader's last pass).", ["pool", "node"]
        )
        self.pool_ready_nodes = self._gauge(
            "pool_ready_nodes",
            "Pool nodes that take runs (members, Ready, not cordoned), by pool; 0: the pool's runs are not placed.",
            ["pool"],
        )
        self.taint_changes = self._counter(
            "taint_changes_total", "Taints added or removed on pool nodes.", ["pool", "action"]
        )
        self.taint_drift_nodes = self._gauge(
            "taint_drift_nodes",
            "Nodes whose egress-placer taints differ from what the policy wants, as the leader's last pass found "
            "them (before its writes), by the pool of the taint (the one wanted, else the one to remove).",
            ["pool"],
        )
        self.evictions = self._counter(
            "intruder_evictions_total",
            "Steps taken against intruder pods on pool nodes, by pool and outcome: evicted, deferred (a "
            "PodDisruptionBudget refused), deleted-past-budget-grace (refused for the whole budget grace), "
            "deleted-after-grace (still there once the eviction's grace was over: deleted with grace 0), "
            "failed. Report mode takes no step: see intruders_reported_total.",
            ["pool", "outcome"],
        )
        self.intruders_reported = self._counter(
            "intruders_reported_total",
            "Intruder pods reported and left where they are (intruder mode report), by pool; one report per "
            "intruder every 10 minutes while it stays.",
            ["pool"],
        )
        self.intruders = self._gauge(
            "intruders",
            "Intruder pods on pool nodes (terminating ones included), as the leader's last pass found them, by pool.",
            ["pool"],
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

    def _queue(self) -> None:
        self.queue_admitted = self._counter(
            "queue_admitted_total", "Runs created pending in a pool's queue at admission, by pool.", ["pool"]
        )
        self.queue_length = self._gauge(
            "queue_length", "Runs waiting in a pool's queue, as the leader's last pass saw them, by pool.", ["pool"]
        )
        self.queue_slots = self._gauge(
            "queue_slots",
            "A queued pool's slots, by state: total (runsPerNode on each Ready, tainted node) and occupied "
            "(pool pods plus released runs whose pod is not bound yet), as the leader's last pass saw them.",
            ["pool", "state"],
        )
        self.queue_over_cap_pods = self._gauge(
            "queue_over_cap_pods",
            "Runs' pods bound to a queued pool beyond its slots, as the leader's last pass saw them, by pool: made "
            "while the webhook did not answer (not gated), or the pool lost nodes. Each gets a Warning Event QueueOverCap.",
            ["pool"],
        )
        self.queue_releases = self._counter(
            "queue_releases_total",
            "Queued runs released by the leader, by pool and reason: slot (a slot was free), timeout (waited past "
            "maxQueueSeconds on a preferred pool: to ordinary nodes), unqueued (the pool no longer queues).",
            ["pool", "reason"],
        )
        self.queue_wait_seconds = Histogram(
            "egress_placer_queue_wait_seconds",
            "Seconds a run waited in a pool's queue, from admission to its release, by pool.",
            ["pool"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=self.registry,
        )
        self._queue_overdue = _QueueOverdue()
        self.registry.register(self._queue_overdue)

    def _budgets(self) -> None:
        """Egress budgets (docs/budgets.md). Label values only from the policy (pool, destination) and from
        nodes (address: a node label's value or a node's name), never from a run."""
        self.budget_in_use = self._gauge(
            "budget_in_use",
            "Runs at once of a destination behind an egress address (run pods on the pool's nodes, bound or "
            "chosen), as the leader's last pass saw them.",
            ["pool", "destination", "address"],
        )
        self.budget_window_starts = self._gauge(
            "budget_window_starts",
            "Starts of a destination's runs behind an egress address in its window (destinations with "
            "maxStartsPerWindowPerAddress), as the leader's last pass saw them.",
            ["pool", "destination", "address"],
        )
        self.budget_waits = self._counter(
            "budget_waits_total",
            "Runs a destination's budget held at admission (mode Enforce), or would have held (ReportOnly: "
            "counted at Pod CREATE), by pool, destination and mode.",
            ["pool", "destination", "mode"],
        )

    def _history(self) -> None:
        """A pool's `history` rule (docs/suggest.md): label values from the policy only (pool), never from a run."""
        self.history_groups = self._gauge(
            "history_groups",
            "Tasks and Pipeline tasks in a pool's measured set (pools with history): their runs go to the pool.",
            ["pool"],
        )
        self.history_reads = self._counter(
            "history_reads_total", "Reads of a pool's history from Prometheus, by result.", ["pool", "result"]
        )
        self.history_read_timestamp = self._gauge(
            "history_last_read_timestamp_seconds",
            "When a pool's measured set was last computed from a successful read (Unix seconds).",
            ["pool"],
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
        self.policy_ready = self._gauge(
            "policy_ready",
            "1 when the policy in force is the policy source's own (/readyz says ready, not degraded); 0 while "
            "the source's policy is refused or missing (an earlier or the stored last good policy, or none, in force).",
        )
        self.policy_in_force = self._gauge(
            "policy_in_force",
            "1 when a valid policy is in force (the source's, an earlier one or the stored last good one); 0: none, "
            "nothing is placed on a pool and the pool taints stay.",
        )
        self.api_write_retries = self._counter(
            "api_write_retries_total", "API writes retried, by operation and cause.", ["operation", "cause"]
        )
        self.events_dropped = self._counter(
            "events_dropped_total", "Kubernetes Events not sent because the queue was full."
        )
        self.is_leader = self._gauge("leader", "1 while this replica holds the leader lease.")
        self.storage_migration_pending = self._gauge(
            "storage_migration_pending",
            "1 until the leader's migration of the pools API's stored objects to v1beta1 (and storedVersions) "
            "succeeded in this process, 0 after; 0 on a replica that does not lead (pools API only).",
        )
        self.storage_migration_failures = self._counter(
            "storage_migration_failures_total", "Tries of the leader's storage migration that failed (tried again with backoff)."
        )
        self.certificate_expiry = self._gauge(
            "webhook_certificate_expiration_timestamp_seconds",
            "When the serving certificate the webhook presents expires (its notAfter, Unix seconds); 0 until one is loaded.",
        )

    # -- wiring --------------------------------------------------------------------------------------

    def count_malformed_review(self) -> None:
        """A review whose body could not be read (any webhook path)."""
        self.admission_reviews.labels(kind=UNKNOWN_KIND, outcome=MALFORMED).inc()

    def track_policy(self, ready: Callable[[], bool], in_force: Callable[[], bool]) -> None:
        """policy_ready and policy_in_force read from the policy tracker at each scrape."""
        self.policy_ready.set_function(lambda: 1.0 if ready() else 0.0)
        self.policy_in_force.set_function(lambda: 1.0 if in_force() else 0.0)

    def track_certificate(self, not_after: Callable[[], float | None]) -> None:
        """certificate_expiry read from the served certificate at each scrape (0 while none is loaded)."""
        self.certificate_expiry.set_function(lambda: not_after() or 0.0)

    def track_queue_overdue(self, overdue: Callable[[], Mapping[str, int]], leading: Callable[[], bool]) -> None:
        """egress_placer_queue_overdue_runs read at each scrape from the queue reconciler's last plans
        (runs per pool held past its maxQueueSeconds), on the leader only."""
        self._queue_overdue.overdue, self._queue_overdue.leading = overdue, leading

    def clear_leader_series(self) -> None:
        """Remove every series only the leader sets (this replica stopped leading)."""
        for name in LEADER_SERIES:
            getattr(self, name).clear()
        self.storage_migration_pending.set(0)  # no labels to remove: a follower says "nothing pending here"


class GaugeSnapshot:
    """The series of one labelled gauge as a whole: `set(values)` sets these label sets and removes
    the ones the previous call set that are not among them (a pool node that left, a pool the
    policy dropped)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._set: dict[tuple[str, ...], tuple[Any, float]] = {}  # label set -> (its series, the value set)

    def set(self, values: Mapping[tuple[str, ...], float]) -> None:
        """A series whose value did not change since the last call is left as it is (a pass over 5,000
        pool nodes changes few: `labels()` on each was most of the pool metrics' pass, #24), unless it was
        removed meanwhile (cleared when this replica stopped leading): then it is set again."""
        for labels in self._set.keys() - values.keys():
            try:
                self.gauge.remove(*labels)
            except KeyError:  # already gone (cleared when this replica stopped leading)
                pass
        live = self.gauge._metrics  # noqa: SLF001 - the gauge's series by label values (a read, under the GIL)
        last = self._set
        now: dict[tuple[str, ...], tuple[Any, float]] = {}
        for labels, value in values.items():
            seen = last.get(labels)
            if seen is not None and seen[1] == value and live.get(labels) is seen[0]:
                now[labels] = seen
                continue
            series = self.gauge.labels(*labels)
            series.set(value)
            now[labels] = (series, value)
        self._set = now


class _QueueOverdue:
    """egress_placer_queue_overdue_runs: a collector, read at each scrape (`Metrics.track_queue_overdue`)."""

    def __init__(self) -> None:
        self.overdue: Callable[[], Mapping[str, int]] = dict
        self.leading: Callable[[], bool] = lambda: False

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "egress_placer_queue_overdue_runs",
            "Runs waiting in a pool's queue past its maxQueueSeconds (a required pool keeps them waiting for a slot), "
            "as the leader's last pass saw them, by pool.",
            labels=["pool"],
        )
        if self.leading():
            for pool, count in sorted(self.overdue().items()):
                family.add_metric([pool], float(count))
        yield family
