"""A real Prometheus server on loopback, as one of the cluster's recorded processes.

`start_prometheus(cluster, {node: url})` builds Prometheus on demand (`build.ensure_optional`, its
own cache key: `up` never waits for it), writes a config with one static scrape job per target
labelled `node: <node name>` (a series' own `node` label is kept: honor_labels), starts it on 127.0.0.1 (so `python -m devcluster down` stops it
too) and returns its URL once it is ready and has scraped every target. Data lives in
`DIR/prometheus/data` (kept across restarts of the same cluster, removed with the directory).

`web_config`: Prometheus as users run it behind auth (`--web.config.file`: `basic_auth_users` with bcrypt
hashes, `tls_server_config` with a serving certificate, then the URL is https); `probe` is the session that
may read it (credentials, the CA) for the readiness and scrape checks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

import requests
import yaml

from devcluster import build
from devcluster.cluster import Cluster, ClusterError
from devcluster.process import free_port

PROCESS_NAME = "prometheus"
NODE_LABEL = "node"  # the label each scrape job puts on its target's series: the node's name
READY_TIMEOUT = 60.0


def scrape_config(targets: Mapping[str, str], scrape_interval: str) -> dict[str, object]:
    """Prometheus' configuration: one job per node, its single target labelled with the node's name."""
    jobs = []
    for node, url in sorted(targets.items()):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"target of {node}: {url!r} is not an http(s) URL")
        jobs.append(
            {
                "job_name": f"egress-{node}",
                "scheme": parts.scheme,
                "metrics_path": parts.path or "/metrics",
                # A target's own labels win (an exporter of pods' series names their node itself); the
                # job's `node` label names the target's node for those that do not.
                "honor_labels": True,
                "static_configs": [{"targets": [parts.netloc], "labels": {NODE_LABEL: node}}],
            }
        )
    return {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": jobs,
    }


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # loopback: never through a proxy from the environment
    return session


def start_prometheus(
    cluster: Cluster,
    targets: Mapping[str, str],
    scrape_interval: str = "1s",
    *,
    port: int | None = None,
    timeout: float = READY_TIMEOUT,
    web_config: Mapping[str, object] | None = None,
    probe: requests.Session | None = None,
) -> str:
    """Start Prometheus scraping `targets` (node name -> metrics URL); return its base URL.

    Returns once `/-/ready` answers and every target has been scraped up. `port`: reuse a port
    (e.g. to restart it where a policy already points), else a free one.
    """
    bin_dir = build.ensure_optional(PROCESS_NAME, cluster.log)
    home = cluster.dir / PROCESS_NAME
    (home / "data").mkdir(parents=True, exist_ok=True)
    config_file = home / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(scrape_config(targets, scrape_interval), sort_keys=False))
    port = port or free_port()
    scheme = "https" if web_config and "tls_server_config" in web_config else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    argv = [
        str(bin_dir / "prometheus"),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={home / 'data'}",
        "--storage.tsdb.retention.time=2h",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    if web_config is not None:
        web_file = home / "web.yml"
        web_file.write_text(yaml.safe_dump(dict(web_config), sort_keys=False))
        argv.append(f"--web.config.file={web_file}")
    record = cluster.start_process(PROCESS_NAME, argv, port=port, health_url=f"{url}/-/ready")
    try:
        _wait_scraped(url, record.log, set(targets), timeout, probe or _session())
    except BaseException:
        cluster.stop_process(PROCESS_NAME)
        raise
    return url


def stop_prometheus(cluster: Cluster) -> None:
    """Stop the cluster's Prometheus (nothing when it does not run)."""
    cluster.stop_process(PROCESS_NAME)


def _wait_scraped(url: str, log: str, nodes: set[str], timeout: float, session: requests.Session) -> None:
    deadline = time.monotonic() + timeout
    up: set[str] = set()
    while True:
        try:
            answer = session.get(f"{url}/api/v1/targets", params={"state": "active"}, timeout=2)
            if answer.status_code == 200:
                active = answer.json()["data"]["activeTargets"]
                up = {t["labels"].get(NODE_LABEL) for t in active if t.get("health") == "up"}
                if nodes <= up:
                    return
        except requests.RequestException:
            pass  # not listening yet
        if time.monotonic() > deadline:
            tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-20:]) if Path(log).exists() else ""
            raise ClusterError(
                f"Prometheus at {url} did not scrape {sorted(nodes - up)} within {timeout:.0f} s; log tail:\n{tail}"
            )
        time.sleep(0.25)


def query(url: str, promql: str, timeout: float = 5.0) -> dict[str, float]:
    """An instant query's vector as {value of the `node` label: value} (for tests and benchmarks)."""
    answer = _session().get(f"{url}/api/v1/query", params={"query": promql}, timeout=timeout)
    answer.raise_for_status()
    return {r["metric"].get(NODE_LABEL, ""): float(r["value"][1]) for r in answer.json()["data"]["result"]}


def wait_for_rates(
    url: str, promql: str, expected: Mapping[str, float], tolerance: float = 0.05, timeout: float = 30.0
) -> dict[str, float]:
    """Wait until `promql` gives every node its expected value within `tolerance` (a fraction of the
    largest expected value); return the values seen."""
    scale = max([*expected.values(), 1.0])
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while True:
        try:
            seen = query(url, promql)
        except requests.RequestException:
            seen = {}
        if all(node in seen and abs(seen[node] - want) <= tolerance * scale for node, want in expected.items()):
            return seen
        if time.monotonic() > deadline:
            raise ClusterError(f"Prometheus at {url}: {promql} gave {seen}, expected about {dict(expected)}")
        time.sleep(0.5)
