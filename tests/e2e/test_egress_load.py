"""End to end, egress load: with a real Prometheus scraping one fake exporter per pool node, and pool
`overseas` ranking its nodes by measured outbound throughput (`egressLoad`), a burst of long uploads
avoids the node whose link is nearly full; `egress-placer status` shows each node's throughput and
the age of the figure; with Prometheus stopped, node choice falls back to run counts and says so
(metric, log line) while admission keeps placing every run; with Prometheus back, figures return."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devcluster.cluster import Cluster
from devcluster.prometheus import start_prometheus, stop_prometheus, wait_for_rates
from devplacer.local_placer import service_account_user
from devplacer.egress_exporter import EGRESS_QUERY, EgressExporter, egress_load_block, start_exporters, stop_exporters
from tests.e2e.harness import POLICY_FILE, Placer, running_placer
from tests.e2e.tekton_runs import MATCHING_IMAGE, POOL, POOL_NODES, TEAM_CDN, Runs, decision_of, taskrun
from tests.kube import Api
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

BANDWIDTH = 100_000_000.0  # bytes per second each pool node can send
BUSY_NODE = "egress-1"
RATES = {BUSY_NODE: 0.95 * BANDWIDTH, "egress-2": 0.01 * BANDWIDTH, "egress-3": 0.01 * BANDWIDTH}
BURST = 24  # an even share is 8 per node
MAX_ON_BUSY = 2  # egress-aware: the busy node takes at most this many (its ratio 0.95 against ~0.1)
MIN_ON_BUSY_BY_COUNTS = BURST // 3 - 2  # run counts only: about an even share
RUN_DURATION = {"devcluster.egress-placer.io/run-duration": "60s"}  # pods stay Running through the test
FIGURE_TIMEOUT = 45.0  # maxAge 15 s + polls + slack


@dataclass
class EgressLoadRig:
    """Exporters, Prometheus and the policy file pointing at it."""

    cluster: Cluster
    exporters: dict[str, EgressExporter]
    prometheus_url: str
    policy_file: Path

    @property
    def targets(self) -> dict[str, str]:
        return {node: e.url for node, e in self.exporters.items()}

    def restart_prometheus(self) -> None:
        """Start Prometheus again on the same port (where the policy points)."""
        port = int(self.prometheus_url.rsplit(":", 1)[1])
        start_prometheus(self.cluster, self.targets, port=port)


def egress_policy(prometheus_url: str) -> str:
    """The e2e policy with an `egressLoad` block on pool `overseas`."""
    policy = yaml.safe_load(POLICY_FILE.read_text())
    (pool,) = [p for p in policy["pools"] if p["name"] == POOL]
    pool["egressLoad"] = egress_load_block(prometheus_url, BANDWIDTH)
    return yaml.safe_dump(policy, sort_keys=False)


@pytest.fixture(scope="module")
def rig(devcluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EgressLoadRig]:
    exporters = start_exporters(RATES)
    try:
        url = start_prometheus(devcluster, {node: e.url for node, e in exporters.items()})
        wait_for_rates(url, EGRESS_QUERY, RATES)
        policy_file = tmp_path_factory.mktemp("egress-load") / "policy.yaml"
        policy_file.write_text(egress_policy(url))
        yield EgressLoadRig(devcluster, exporters, url, policy_file)
    finally:
        stop_prometheus(devcluster)
        stop_exporters(exporters.values())


@pytest.fixture(scope="module")
def egress_placer(
    devcluster: Cluster, api: Api, tenants: tuple[str, str], rig: EgressLoadRig
) -> Iterator[Placer]:
    """egress-placer with the egress-load policy (overrides the e2e fixture); the cluster made plain after."""
    with running_placer(devcluster, api, rig.policy_file) as placer:
        yield placer


def egress_series(placer: Placer, name: str) -> dict[str, float]:
    """The controller's per-node samples of metric `name` for pool `overseas`."""
    text = requests.get(placer.replica.health_url + "/metrics", timeout=5).text
    return {
        s.labels["node"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("pool") == POOL
    }


def measured_everywhere(placer: Placer) -> bool:
    """Every pool node has a fresh figure, the busy one near its rate."""
    bps = egress_series(placer, "egress_placer_egress_bytes_per_second")
    fallback = egress_series(placer, "egress_placer_egress_fallback")
    return (
        set(bps) == POOL_NODES
        and fallback == {node: 0.0 for node in POOL_NODES}
        and bps[BUSY_NODE] > 0.9 * RATES[BUSY_NODE]
    )


def burst(runs: Runs, prefix: str) -> dict[str, str]:
    """BURST long uploads created at once; the node each pod was bound to."""
    names = [runs.name(f"{prefix}-{i}") for i in range(BURST)]
    runs.create_all((TEAM_CDN, "taskruns", taskrun(name, MATCHING_IMAGE, annotations=RUN_DURATION)) for name in names)

    def bound() -> dict[str, str] | None:
        nodes = runs.nodes_of(TEAM_CDN, names)
        return nodes if all(nodes.values()) else None  # type: ignore[return-value]

    return wait_for(f"{BURST} pods to be bound", bound, timeout=90, interval=0.5)


def test_a_burst_of_uploads_avoids_the_node_whose_link_is_nearly_full(
    runs: Runs, egress_placer: Placer
) -> None:
    wait_for("the controller's figures for every pool node", lambda: measured_everywhere(egress_placer), timeout=FIGURE_TIMEOUT)

    nodes = burst(runs, "upload")

    per_node = Counter(nodes.values())
    assert set(per_node) <= POOL_NODES, per_node
    assert per_node[BUSY_NODE] <= MAX_ON_BUSY, per_node
    decisions = {decision_of(r).get("reason") for r in runs.listed(TEAM_CDN, "taskruns").values()}
    assert decisions == {"image-match"}


def test_status_shows_each_pool_node_s_throughput_and_the_age_of_the_figure(
    devcluster: Cluster, rig: EgressLoadRig, egress_placer: Placer
) -> None:
    kubeconfig = devcluster.mint_kubeconfig(service_account_user())  # the controller's own RBAC
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_PLACER_")}
    result = subprocess.run(
        [sys.executable, "-m", "controller", "status", "--json", "--policy", str(rig.policy_file)],
        env={**env, "EGRESS_PLACER_KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr[-2000:]
    rows = {r["node"]: r["egress"] for r in json.loads(result.stdout) if r["pool"] == POOL}
    assert set(rows) == POOL_NODES, rows
    figures = {}
    for node, text in rows.items():
        match = re.fullmatch(r"(\d+\.\d\d) MB/s, (\d+)s old", text)
        assert match, (node, text)
        figures[node] = (float(match[1]), int(match[2]))
    for node, (mbps, age) in figures.items():
        assert mbps == pytest.approx(RATES[node] / 1e6, abs=0.05 * BANDWIDTH / 1e6), (node, figures)
        assert age <= 15, (node, figures)


def test_without_prometheus_choice_falls_back_to_run_counts_and_admission_keeps_placing(
    runs: Runs, rig: EgressLoadRig, egress_placer: Placer
) -> None:
    wait_for("the controller's figures for every pool node", lambda: measured_everywhere(egress_placer), timeout=FIGURE_TIMEOUT)
    offset = egress_placer.log.stat().st_size
    stop_prometheus(rig.cluster)
    try:
        wait_for(
            "egress_placer_egress_fallback == 1 on every pool node",
            lambda: egress_series(egress_placer, "egress_placer_egress_fallback") == {n: 1.0 for n in POOL_NODES},
            timeout=FIGURE_TIMEOUT,
        )
        failures = [
            r for r in egress_placer.log_records(offset) if r.get("pool") == POOL and "egress query failed" in str(r["message"])
        ]
        assert failures, "no log line says the egress query failed"
        assert failures[0]["level"] == "WARNING"

        nodes = burst(runs, "blind")

        per_node = Counter(nodes.values())
        assert set(per_node) <= POOL_NODES, per_node
        assert per_node[BUSY_NODE] >= MIN_ON_BUSY_BY_COUNTS, per_node  # the busy link is not seen any more
        decisions = {(d.get("pool"), d.get("reason")) for d in map(decision_of, runs.listed(TEAM_CDN, "taskruns").values())}
        assert decisions == {(POOL, "image-match")}
    finally:
        rig.restart_prometheus()
    wait_for("figures back on every pool node", lambda: measured_everywhere(egress_placer), timeout=FIGURE_TIMEOUT)
    assert any("egress figures are back" in str(r["message"]) for r in egress_placer.log_records(offset))
