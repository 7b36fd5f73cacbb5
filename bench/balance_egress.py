"""Section 4 (balance), the egress case: where a burst of uploads goes when one pool node's link is nearly full.

On the local cluster, with a real Prometheus scraping a fake exporter per pool node (one node sending
at `busy_fraction` of its bandwidth, the others at `idle_fraction`), the same burst of long-running
TaskRuns is placed twice: (a) with the pool's `egressLoad` (egress-aware node choice), (b) with the
same policy without it (run counts only). `run_egress_case` returns the figures: pods per node, the
busy node's share against an even share, and how long the burst took to be bound.

    python -m bench.balance_egress [--dir RUNNING_CLUSTER_DIR] [--burst 30]   # prints the figures as JSON
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import requests
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from devcluster.cluster import EGRESS_POOL, EGRESS_POOL_LABEL, Cluster, ClusterError
from devplacer.local_placer import WEBHOOK_CONFIG, apply_policy, replicas_of, start_controller, stop_controller
from devplacer.egress_exporter import EGRESS_QUERY, EgressExporter, egress_load_block, start_exporters, stop_exporters
from devcluster.prometheus import start_prometheus, stop_prometheus, wait_for_rates

NAMESPACE = "bench-egress"
IMAGE = "registry.example.com/cdn-uploader:1.4"
CASE_LABEL = "bench.egress-placer.io/case"
RUN_DURATION = "120s"  # every pod of a burst still runs when the burst's figures are read
TAINT_KEY = "egress-placer.io/pool"
Log = Callable[[str], None]


def policy(prometheus_url: str | None, bandwidth: float, capacity: int | None, nodes: list[str] | None = None) -> str:
    """Pool `overseas` (the local cluster's egress nodes, or `nodes` by name) for uploads from NAMESPACE;
    with an `egressLoad` reading `prometheus_url`, or without one (run counts only) when it is None."""
    pool: dict[str, Any] = {"name": EGRESS_POOL}
    pool.update({"nodes": nodes} if nodes else {"nodeSelector": {EGRESS_POOL_LABEL: EGRESS_POOL}})
    pool.update({"images": ["*uploader*"], "namespaces": [NAMESPACE], "placement": "required"})
    if capacity is not None:
        pool["capacity"] = capacity
    if prometheus_url is not None:
        pool["egressLoad"] = egress_load_block(prometheus_url, bandwidth)
    doc = {"apiVersion": "egress-placer.io/v1alpha1", "kind": "PlacementPolicy", "pools": [pool]}
    return yaml.safe_dump(doc, sort_keys=False)


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _controller_series(cluster: Cluster, name: str) -> dict[str, float]:
    """The running controller's per-node samples of metric `name` for the pool."""
    text = requests.get(replicas_of(cluster)[0].health_url + "/metrics", timeout=5).text
    return {
        s.labels["node"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("pool") == EGRESS_POOL
    }


class _Bench:
    """The cluster's API for one case: namespace, bursts, clean-up."""

    def __init__(self, cluster: Cluster) -> None:
        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def pool_nodes(self) -> list[str]:
        nodes = self.core.list_node(label_selector=f"{EGRESS_POOL_LABEL}={EGRESS_POOL}").items
        return sorted(n.metadata.name for n in nodes)

    def make_namespace(self) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as e:
            if e.status != 409:
                raise
        _wait(
            f"ServiceAccount {NAMESPACE}/default",
            lambda: self.core.list_namespaced_service_account(NAMESPACE, field_selector="metadata.name=default").items,
            60,
        )

    def burst(self, label: str, size: int) -> tuple[dict[str, int], float]:
        """`size` TaskRuns created at once (one thread each); pods per node once all are bound, and the seconds that took."""

        def body(i: int) -> dict[str, Any]:
            return {
                "apiVersion": "tekton.dev/v1",
                "kind": "TaskRun",
                "metadata": {
                    "name": f"{label}-{i}",
                    "labels": {CASE_LABEL: label},
                    "annotations": {"devcluster.egress-placer.io/run-duration": RUN_DURATION},
                },
                "spec": {"taskSpec": {"steps": [{"name": "upload", "image": IMAGE, "script": "echo upload"}]}},
            }

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=size) as pool:
            for future in [
                pool.submit(self.custom.create_namespaced_custom_object, "tekton.dev", "v1", NAMESPACE, "taskruns", body(i))
                for i in range(size)
            ]:
                future.result()

        def bound() -> list[str] | None:
            pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=f"{CASE_LABEL}={label},tekton.dev/taskRun").items
            nodes = [p.spec.node_name for p in pods]
            return nodes if len(nodes) == size and all(nodes) else None

        nodes = _wait(f"{size} pods of {label} to be bound", bound, 120)
        return dict(sorted(Counter(nodes).items())), time.monotonic() - started

    def delete_burst(self, label: str) -> None:
        self.custom.delete_collection_namespaced_custom_object(
            "tekton.dev", "v1", NAMESPACE, "taskruns", label_selector=f"{CASE_LABEL}={label}"
        )
        _wait(
            f"pods of {label} to be gone",
            lambda: not self.core.list_namespaced_pod(NAMESPACE, label_selector=f"{CASE_LABEL}={label}").items,
            120,
        )

    def make_plain(self) -> None:
        """No webhook configuration, no pool taints, no bench namespace."""
        try:
            client.AdmissionregistrationV1Api(self.api).delete_mutating_webhook_configuration(WEBHOOK_CONFIG)
        except ApiException as e:
            if e.status != 404:
                raise
        for node in self.core.list_node().items:
            taints = node.spec.taints or []
            kept = [self.api.sanitize_for_serialization(t) for t in taints if t.key != TAINT_KEY]
            if len(kept) != len(taints):
                self.core.patch_node(node.metadata.name, {"spec": {"taints": kept or None}})
        try:
            self.core.delete_namespace(NAMESPACE)
        except ApiException as e:
            if e.status != 404:
                raise
        self.api.close()


def _placement(per_node: dict[str, int], nodes: list[str], busy: str, seconds: float) -> dict[str, Any]:
    total = sum(per_node.values())
    return {
        "pods_per_node": {n: per_node.get(n, 0) for n in nodes},
        "pods_outside_pool": sum(v for n, v in per_node.items() if n not in nodes),
        "busy_node_pods": per_node.get(busy, 0),
        "busy_node_share": round(per_node.get(busy, 0) / total, 3) if total else None,
        "seconds_to_bind": round(seconds, 2),
    }


def run_egress_case(
    cluster_dir: str | Path | None = None,
    *,
    burst: int = 30,
    bandwidth: float = 100_000_000.0,
    busy_fraction: float = 0.95,
    idle_fraction: float = 0.01,
    capacity: int | None = None,
    nodes: list[str] | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Run the case on the running cluster in `cluster_dir` (left running, made plain again), or on
    a cluster of its own (brought up and down) when None; return the figures. The pool is the
    cluster's egress nodes, or `nodes` when given (the benchmark's bigger clusters: a few of them)."""
    own = cluster_dir is None
    cluster = Cluster(Path(cluster_dir) if cluster_dir else Path(tempfile.mkdtemp(prefix="bench-egress-")), log=log)
    if own:
        cluster.up()
    elif not cluster.is_running():
        raise ClusterError(f"no running cluster in {cluster.dir}")
    bench = _Bench(cluster)
    exporters: dict[str, EgressExporter] = {}
    try:
        nodes = sorted(nodes) if nodes else bench.pool_nodes()
        if len(nodes) < 2:
            raise ClusterError(f"the case needs at least 2 pool nodes, the cluster has {nodes}")
        busy = nodes[0]
        rates = {n: (busy_fraction if n == busy else idle_fraction) * bandwidth for n in nodes}
        bench.make_namespace()
        exporters = start_exporters(rates)
        started = time.monotonic()
        url = start_prometheus(cluster, {n: e.url for n, e in exporters.items()})
        prometheus_start = time.monotonic() - started
        measured = wait_for_rates(url, EGRESS_QUERY, rates)
        log(f"[egress-case] Prometheus {url} up in {prometheus_start:.1f} s; measured {measured}")

        policy_file = cluster.dir / "bench-egress-policy.yaml"
        policy_file.write_text(policy(url, bandwidth, capacity, nodes))
        start_controller(cluster, policy_file)
        _wait(
            "the controller's egress figures",
            lambda: _controller_series(cluster, "egress_placer_egress_fallback") == {n: 0.0 for n in nodes},
            45,
        )
        aware, aware_seconds = bench.burst("aware", burst)
        log(f"[egress-case] (a) egress-aware: {aware}")
        bench.delete_burst("aware")

        apply_policy(cluster, policy(None, bandwidth, capacity, nodes))
        _wait("the controller to drop the egress source", lambda: not _controller_series(cluster, "egress_placer_egress_fallback"), 45)
        counts, counts_seconds = bench.burst("counts", burst)
        log(f"[egress-case] (b) run counts only: {counts}")
        bench.delete_burst("counts")
        return {
            "case": "egress-load",
            "burst": burst,
            "pool_nodes": nodes,
            "busy_node": busy,
            "busy_fraction": busy_fraction,
            "idle_fraction": idle_fraction,
            "bandwidth_bytes_per_second": bandwidth,
            "exporter_bytes_per_second": rates,
            "prometheus_bytes_per_second": {n: round(v) for n, v in sorted(measured.items())},
            "prometheus_start_seconds": round(prometheus_start, 2),
            "even_share": round(1 / len(nodes), 3),
            "egress_aware": _placement(aware, nodes, busy, aware_seconds),
            "run_counts_only": _placement(counts, nodes, busy, counts_seconds),
        }
    finally:
        stop_controller(cluster)
        stop_prometheus(cluster)
        stop_exporters(exporters.values())
        bench.make_plain()
        if own:
            cluster.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.balance_egress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help="a running cluster (default: bring one up and down)")
    parser.add_argument("--burst", type=int, default=30)
    parser.add_argument("--capacity", type=int, default=None, help="the pool's capacity (default: allocatable pods)")
    args = parser.parse_args(argv)
    progress = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731 - stdout holds the JSON
    figures = run_egress_case(args.dir, burst=args.burst, capacity=args.capacity, log=progress)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
