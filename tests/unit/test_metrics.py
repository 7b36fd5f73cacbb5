"""The metrics contract: every series /metrics exports, with its type and labels (CONTRACT), the same
as docs/metrics.md; every declared metric is set somewhere in the controller; and the series added
for operating it behave: the pool's load from the leader's pass (set, and removed for a node that
left), series only the leader sets removed when it stops leading, build info, the serving
certificate's expiry, the policy's readiness, and the outcome of each admission review.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

import controller
from controller.admission.certs import ServingTLS, make_ca, make_serving_cert
from controller.core.policy import load_policy
from controller.prometheus.egress_source import EgressPollers
from controller.metrics import LEADER_SERIES, GaugeSnapshot, Metrics
from controller.pool_status.metrics import PoolMetrics
from controller.runner import Runner
from controller.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]

# name -> (type, labels). The contract: a change here is a change for dashboards and alerts.
CONTRACT: dict[str, tuple[str, tuple[str, ...]]] = {
    "egress_placer_build_info": ("gauge", ("python_version", "version")),
    "egress_placer_decisions_total": ("counter", ("kind", "pool", "reason")),
    "egress_placer_admission_duration_seconds": ("histogram", ("kind",)),
    "egress_placer_admission_reviews_total": ("counter", ("kind", "outcome")),
    "egress_placer_admission_turned_away_total": ("counter", ("reason",)),
    "egress_placer_admission_owner_reads_total": ("counter", ("outcome",)),
    "egress_placer_webhook_connections_total": ("counter", ("event",)),
    "egress_placer_pool_node_load": ("gauge", ("node", "pool", "state")),
    "egress_placer_pool_node_capacity": ("gauge", ("node", "pool")),
    "egress_placer_pool_ready_nodes": ("gauge", ("pool",)),
    "egress_placer_taint_changes_total": ("counter", ("action", "pool")),
    "egress_placer_taint_drift_nodes": ("gauge", ("pool",)),
    "egress_placer_intruder_evictions_total": ("counter", ("outcome", "pool")),
    "egress_placer_intruders_reported_total": ("counter", ("pool",)),
    "egress_placer_intruders": ("gauge", ("pool",)),
    "egress_placer_intruders_removed_total": ("counter", ("pool", "step")),
    "egress_placer_intruder_clear_seconds": ("histogram", ("pool",)),
    "egress_placer_queue_admitted_total": ("counter", ("pool",)),
    "egress_placer_queue_length": ("gauge", ("pool",)),
    "egress_placer_queue_slots": ("gauge", ("pool", "state")),
    "egress_placer_queue_over_cap_pods": ("gauge", ("pool",)),
    "egress_placer_queue_releases_total": ("counter", ("pool", "reason")),
    "egress_placer_queue_wait_seconds": ("histogram", ("pool",)),
    "egress_placer_queue_overdue_runs": ("gauge", ("pool",)),
    "egress_placer_budget_in_use": ("gauge", ("address", "destination", "pool")),
    "egress_placer_budget_window_starts": ("gauge", ("address", "destination", "pool")),
    "egress_placer_budget_waits_total": ("counter", ("destination", "mode", "pool")),
    "egress_placer_agent_tolerations_added_total": ("counter", ("by",)),
    "egress_placer_agent_pool_nodes_missing": ("gauge", ("daemonset", "namespace")),
    "egress_placer_watch_restarts_total": ("counter", ("cause", "resource")),
    "egress_placer_policy_reloads_total": ("counter", ("result",)),
    "egress_placer_policy_valid": ("gauge", ()),
    "egress_placer_policy_ready": ("gauge", ()),
    "egress_placer_policy_in_force": ("gauge", ()),
    "egress_placer_api_write_retries_total": ("counter", ("cause", "operation")),
    "egress_placer_events_dropped_total": ("counter", ()),
    "egress_placer_leader": ("gauge", ()),
    "egress_placer_storage_migration_pending": ("gauge", ()),
    "egress_placer_storage_migration_failures_total": ("counter", ()),
    "egress_placer_webhook_certificate_expiration_timestamp_seconds": ("gauge", ()),
    "egress_placer_egress_bytes_per_second": ("gauge", ("node", "pool")),
    "egress_placer_egress_figure_age_seconds": ("gauge", ("node", "pool")),
    "egress_placer_egress_fallback": ("gauge", ("node", "pool")),
    "egress_placer_egress_scrapes_total": ("counter", ("pool", "result")),
    "egress_placer_history_groups": ("gauge", ("pool",)),
    "egress_placer_history_reads_total": ("counter", ("pool", "result")),
    "egress_placer_history_last_read_timestamp_seconds": ("gauge", ("pool",)),
    # prometheus_client's process, platform and garbage-collector collectors
    "process_cpu_seconds_total": ("counter", ()),
    "process_resident_memory_bytes": ("gauge", ()),
    "process_virtual_memory_bytes": ("gauge", ()),
    "process_open_fds": ("gauge", ()),
    "process_max_fds": ("gauge", ()),
    "process_start_time_seconds": ("gauge", ()),
    "python_info": ("gauge", ("implementation", "major", "minor", "patchlevel", "version")),
    "python_gc_objects_collected_total": ("counter", ("generation",)),
    "python_gc_objects_uncollectable_total": ("counter", ("generation",)),
    "python_gc_collections_total": ("counter", ("generation",)),
}
# Set through a callable read at each scrape, wired in controller/app.py.
READ_AT_SCRAPE = {"policy_ready": "track_policy(", "policy_in_force": "track_policy(", "certificate_expiry": "track_certificate("}
POLICY = """
apiVersion: egress-placer.io/v1alpha1
kind: PlacementPolicy
pools:
  - name: overseas
    nodeSelector: {egress: "yes"}
    namespaces: ["team-*"]
"""


class NoEgressState:
    def set_egress_figures(self, pool: str, snapshot: Any) -> None: ...

    def pool_nodes(self, pool: Any) -> list[Any]:
        return []


def declared(metrics: Metrics) -> dict[str, MetricWrapperBase]:
    return {attr: m for attr, m in vars(metrics).items() if isinstance(m, MetricWrapperBase)}


def exposition_with_a_sample_of_everything() -> str:
    """/metrics of a fresh controller's registry after one sample of every labelled series."""
    metrics = Metrics()
    pollers = EgressPollers(NoEgressState(), lambda: 0.0, Runner(), registry=metrics.registry)
    pollers.statuses = lambda: [  # type: ignore[method-assign]
        {"pool": "p", "scrapes": {"ok": 1}, "nodes": {"n": {"bps": 1.0, "age": 2.0, "source": "measured"}}}
    ]
    metrics.track_queue_overdue(lambda: {"x": 1}, leading=lambda: True)
    for metric in declared(metrics).values():
        names = metric._labelnames  # noqa: SLF001 - prometheus_client lists no label names publicly
        if names:
            child = metric.labels(*["x"] * len(names))
            record = getattr(child, "inc", None) or getattr(child, "observe", None) or child.set
            record(1)
    return generate_latest(metrics.registry).decode()


def families(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, label names) of Prometheus text (histograms without `le`)."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    out: dict[str, tuple[str, set[str]]] = {name: (kind, set()) for name, kind in types.items()}
    for sample, labels in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? \S+$", text, re.M):
        family = next(n for n in (sample, *(sample.removesuffix(s) for s in ("_bucket", "_count", "_sum"))) if n in out)
        out[family][1].update(name for name in re.findall(r'(\w+)="', labels) if name != "le")
    return {name: (kind, tuple(sorted(labels))) for name, (kind, labels) in out.items()}


def test_the_exposition_is_the_contract() -> None:
    assert families(exposition_with_a_sample_of_everything()) == CONTRACT


def test_names_follow_prometheus_conventions() -> None:
    for name, (kind, _) in CONTRACT.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert name.endswith("_total") is (kind == "counter"), f"{name}: counters, and only counters, end in _total"
        assert not re.search(r"_(milliseconds|ms|minutes|days|kilobytes|megabytes)(_|$)", name), f"{name}: base units"


def test_docs_list_exactly_the_contract() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    rows = re.findall(r"^\| `(egress_placer_\w+)` \| (\w+) \|([^|]*)\|", text, re.M)
    documented = {name: (kind, tuple(sorted(re.findall(r"`(\w+)`", labels)))) for name, kind, labels in rows}
    ours = {name: spec for name, spec in CONTRACT.items() if name.startswith("egress_placer_")}
    assert documented == ours
    for name in CONTRACT:
        if not name.startswith("egress_placer_"):
            assert f"`{name}`" in text, name


def test_every_series_named_in_the_docs_and_readme_exists() -> None:
    """Names in prose (README, docs, config, k8s) are series of the contract, or a sample of one."""
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "config").glob("*.md"), ROOT / "k8s" / "README.md"]
    texts += list((ROOT / "k8s").rglob("*.yaml"))
    suffixes = ("", "_bucket", "_count", "_sum")
    named = {(p.name, n) for p in texts for n in re.findall(r"\b(egress_placer_[a-z_]+[a-z])\b", p.read_text())}
    unknown = sorted((f, n) for f, n in named if not any(n.removesuffix(s) in CONTRACT for s in suffixes if n.endswith(s)))
    assert unknown == []


def test_every_declared_metric_is_set_somewhere_in_the_controller() -> None:
    sources = {p: p.read_text() for p in (ROOT / "controller").rglob("*.py") if p != ROOT / "controller" / "metrics.py"}
    app = (ROOT / "controller" / "app.py").read_text()
    never = []
    for attr in declared(Metrics()):
        if attr == "build_info" or attr in READ_AT_SCRAPE and READ_AT_SCRAPE[attr] in app:
            continue
        if not any(re.search(rf"metrics\.{attr}\b", text) for text in sources.values()):
            never.append(attr)
    assert never == []
    assert set(LEADER_SERIES) <= set(declared(Metrics()))


def test_build_info_names_the_version() -> None:
    text = generate_latest(Metrics().registry).decode()
    assert re.search(rf'^egress_placer_build_info\{{python_version="[\d.]+",version="{re.escape(controller.__version__)}"\}} 1\.0$', text, re.M)


# -- the pool's load, from the leader's pass ------------------------------------------------------------
def node(name: str, pool: bool = True, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"egress": "yes"} if pool else {}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}], "allocatable": {"pods": "10"}},
    }


def pod(name: str, node_name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name}, "spec": {"nodeName": node_name}, "status": {"phase": "Running"}}


def samples(metrics: Metrics, attr: str) -> dict[tuple[str, ...], float]:
    metric = getattr(metrics, attr)
    names = metric._labelnames  # noqa: SLF001
    return {tuple(s.labels[n] for n in names): s.value for f in metric.collect() for s in f.samples}


def test_the_pass_sets_load_capacity_and_ready_nodes_and_removes_a_node_that_left() -> None:
    state = ClusterState(load_policy(POLICY), clock=lambda: 1000.0, assumption_ttl=60)
    state.replace("Node", [node("pool-1"), node("pool-2"), node("pool-3", ready=False), node("plain-1", pool=False)])
    state.replace("Pod", [pod("a", "pool-1"), pod("b", "pool-1"), pod("c", "plain-1")])
    (pool,) = state.policy.pools
    chosen = state.load.choose_and_assume(pool, "taskrun/team-a/r", salt="r").node
    assert chosen == "pool-2"  # the least loaded
    metrics = Metrics()
    publish = PoolMetrics(state, metrics, min_interval=0)

    publish()
    assert samples(metrics, "pool_node_load") == {
        ("overseas", "pool-1", "placed"): 2, ("overseas", "pool-1", "assumed"): 0,
        ("overseas", "pool-2", "placed"): 0, ("overseas", "pool-2", "assumed"): 1,
    }
    assert samples(metrics, "pool_node_capacity") == {("overseas", "pool-1"): 10, ("overseas", "pool-2"): 10}
    assert samples(metrics, "pool_ready_nodes") == {("overseas",): 2}

    state.replace("Node", [node("pool-1"), node("plain-1", pool=False)])  # pool-2 left the pool
    publish()
    assert {labels[1] for labels in samples(metrics, "pool_node_load")} == {"pool-1"}
    assert samples(metrics, "pool_node_capacity") == {("overseas", "pool-1"): 10}
    assert samples(metrics, "pool_ready_nodes") == {("overseas",): 1}


def test_a_replica_that_stops_leading_exports_no_leader_series_and_sets_them_again_when_it_leads() -> None:
    state = ClusterState(load_policy(POLICY), clock=lambda: 1000.0)
    state.replace("Node", [node("pool-1")])
    metrics = Metrics()
    publish = PoolMetrics(state, metrics, min_interval=0)
    publish()
    metrics.intruders.labels(pool="overseas").set(1)
    metrics.clear_leader_series()
    assert all(samples(metrics, attr) == {} for attr in LEADER_SERIES)
    publish()  # leading again: the series come back
    assert samples(metrics, "pool_ready_nodes") == {("overseas",): 1}


def test_passes_close_together_count_the_pool_once_per_interval() -> None:
    """A pass reads every pool node's load: a burst of passes does not repeat it."""
    now = [0.0]
    state = ClusterState(load_policy(POLICY), clock=lambda: 1000.0)
    state.replace("Node", [node("pool-1")])
    metrics = Metrics()
    publish = PoolMetrics(state, metrics, min_interval=10.0, clock=lambda: now[0])
    publish()
    state.replace("Node", [node("pool-1"), node("pool-2")])
    for now[0] in (0.2, 5.0, 9.9):
        publish()
        assert samples(metrics, "pool_ready_nodes") == {("overseas",): 1}
    now[0] = 10.0
    publish()
    assert samples(metrics, "pool_ready_nodes") == {("overseas",): 2}


@pytest.mark.parametrize(
    ("passes", "exported"),
    [
        ([{("a",): 1.0}], {("a",): 1.0}),
        ([{("a",): 1.0, ("b",): 2.0}, {("b",): 3.0}], {("b",): 3.0}),
        ([{("a",): 1.0}, {}], {}),
        ([{("a",): 1.0}, "clear", {("a",): 2.0, ("c",): 0.0}], {("a",): 2.0, ("c",): 0.0}),
        ([{("a",): 1.0, ("b",): 2.0}, "clear", {("a",): 1.0, ("b",): 2.0}], {("a",): 1.0, ("b",): 2.0}),
        ([{("a",): 1.0}, {}, {("a",): 1.0}], {("a",): 1.0}),
        ([{("a",): 1.0}, {("a",): 1.0}, {("a",): 4.0}], {("a",): 4.0}),
    ],
    ids=["set", "a-label-set-left", "all-left", "after-a-clear", "unchanged-after-a-clear", "left-and-back", "unchanged-then-changed"],
)
def test_a_gauge_snapshot_exports_exactly_the_last_pass(passes: list[Any], exported: dict[tuple[str, ...], float]) -> None:
    metrics = Metrics()
    snapshot = GaugeSnapshot(metrics.intruders)
    for values in passes:
        metrics.intruders.clear() if values == "clear" else snapshot.set(values)
    assert samples(metrics, "intruders") == exported


def test_a_gauge_snapshot_leaves_the_unchanged_series_alone() -> None:
    """A pass over 5,000 pool nodes changes few series: only those are looked up and set again (#24)."""
    metrics = Metrics()
    snapshot = GaugeSnapshot(metrics.intruders)
    snapshot.set({(f"p{i}",): float(i) for i in range(100)})
    looked_up: list[tuple[str, ...]] = []
    labels = metrics.intruders.labels
    metrics.intruders.labels = lambda *values: looked_up.append(values) or labels(*values)  # type: ignore[method-assign]
    snapshot.set({**{(f"p{i}",): float(i) for i in range(100)}, ("p7",): 70.0})
    assert looked_up == [("p7",)]
    assert samples(metrics, "intruders")[("p7",)] == 70.0 and len(samples(metrics, "intruders")) == 100


# -- read at scrape -------------------------------------------------------------------------------------
def value(metrics: Metrics, name: str) -> float:
    (sample,) = [s for f in metrics.registry.collect() for s in f.samples if s.name == name]
    return sample.value


def test_the_certificate_expiry_is_the_served_certificate_s_not_after() -> None:
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    tls, metrics = ServingTLS(), Metrics()
    metrics.track_certificate(lambda: tls.not_after)
    assert value(metrics, "egress_placer_webhook_certificate_expiration_timestamp_seconds") == 0.0  # none loaded yet
    tls.load(make_serving_cert(make_ca(now), ["localhost"], now, days=90))
    expected = (now + timedelta(days=90)).timestamp()
    assert value(metrics, "egress_placer_webhook_certificate_expiration_timestamp_seconds") == pytest.approx(expected, abs=1)


@pytest.mark.parametrize(("ready", "in_force"), [(True, True), (False, True), (False, False)])
def test_the_policy_gauges_are_read_from_the_tracker(ready: bool, in_force: bool) -> None:
    metrics = Metrics()
    metrics.track_policy(ready=lambda: ready, in_force=lambda: in_force)
    assert value(metrics, "egress_placer_policy_ready") == float(ready)
    assert value(metrics, "egress_placer_policy_in_force") == float(in_force)


def test_queue_overdue_runs_are_the_leaders_last_plans() -> None:
    """egress_placer_queue_overdue_runs (alert EgressPlacerQueueWaitExceeded): read at each scrape, leader only."""
    metrics = Metrics()
    leading = [True]
    metrics.track_queue_overdue(lambda: {"overseas": 2, "lab": 0}, leading=lambda: leading[0])
    text = generate_latest(metrics.registry).decode()
    assert 'egress_placer_queue_overdue_runs{pool="overseas"} 2.0' in text and 'egress_placer_queue_overdue_runs{pool="lab"} 0.0' in text
    leading[0] = False
    assert "egress_placer_queue_overdue_runs{" not in generate_latest(metrics.registry).decode()
