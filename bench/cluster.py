"""The local cluster the cluster benchmarks (balance, scale, end to end) share, and the controller on it.

Pools are made of the devcluster's `egress-N` nodes, listed by name: one pool per burst size
(`pool-3` = egress-1..3, `pool-10` = egress-4..13, ...). Pool `pool-K` allows the namespaces
`bench-*-kK`; the TaskRuns are the catalog's git-clone Task, whose image the policy matches.
The controller runs as in `devplacer.local_placer.start_controller` (the k8s/ manifests, its
ServiceAccount identity, a loopback webhook URL).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from devcluster.cluster import Cluster, ClusterError
from devplacer import local_placer as dc

from bench.kube import Kube
from bench.sizes import Sizes
from bench.workload import RUN_DURATION_ANNOTATION, catalog_task, taskrun

WEBHOOK_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/" + dc.WEBHOOK_CONFIG
TASK = "git-clone"  # script steps only: Tekton never looks its image up in a registry
TASK_IMAGE_GLOB = "ghcr.io/tektoncd-catalog/git-clone:*"
Log = Callable[[str], None]


def pool_nodes(sizes: Sizes) -> dict[int, list[str]]:
    """Pool size -> its egress nodes, consecutive from egress-1."""
    out, first = {}, 1
    for k in sizes.pool_sizes:
        out[k] = [f"egress-{i}" for i in range(first, first + k)]
        first += k
    return out


def pool_name(k: int) -> str:
    return f"pool-{k}"


def namespace_for(what: str, k: int) -> str:
    """A namespace pool-K allows."""
    return f"bench-{what}-k{k}"


def policy_text(pools: Mapping[int, list[str]]) -> str:
    doc = {
        "apiVersion": "egress-placer.io/v1alpha1",
        "kind": "PlacementPolicy",
        "pools": [
            {"name": pool_name(k), "nodes": nodes, "images": [TASK_IMAGE_GLOB], "namespaces": [f"bench-*-k{k}"]}
            for k, nodes in pools.items()
        ],
    }
    return "# The benchmarks' policy (bench/cluster.py).\n" + yaml.safe_dump(doc, sort_keys=False)


def bench_taskrun(namespace: str, name: str, *, run_seconds: int | None = None,
                  pod_template: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A TaskRun of the catalog's git-clone Task; `run_seconds` keeps its pod Running that long (KWOK)."""
    annotations = {RUN_DURATION_ANNOTATION: f"{run_seconds}s"} if run_seconds else {}
    return taskrun(catalog_task(TASK), namespace, name, annotations=annotations, pod_template=pod_template)


@dataclass
class BenchCluster:
    cluster: Cluster
    sizes: Sizes
    workdir: Path
    pools: dict[int, list[str]]
    policy_file: Path
    owned: bool
    log: Log
    saved_webhook: dict[str, Any] | None = field(default=None)

    @property
    def largest_pool(self) -> int:
        return max(self.pools)

    @property
    def probe_namespace(self) -> str:
        """Where dry-run TaskRuns tell whether the webhook is registered (made by `prepare`)."""
        return namespace_for("probe", self.largest_pool)

    # -- the controller ----------------------------------------------------------------------
    def start_controller(self, env: Mapping[str, str] | None = None, ready_timeout: float = dc.READY_TIMEOUT) -> int:
        """Start one replica (`python -m controller run`, settings from `env`); its pid once ready
        (within `ready_timeout` s)."""
        dc.start_controller(self.cluster, self.policy_file, env=env, ready_timeout=ready_timeout)
        record = self.cluster.process("egress-placer-0")
        assert record is not None
        return record.pid

    def stop_controller(self) -> None:
        dc.stop_controller(self.cluster)

    def controller_log(self) -> Path:
        return self.cluster.dir / "logs" / "egress-placer-0.log"

    # -- the webhook registration ------------------------------------------------------------
    async def unregister(self, kube: Kube) -> None:
        """Delete the MutatingWebhookConfiguration (kept to be restored as it was)."""
        current = await kube.get(WEBHOOK_PATH)
        if current is not None:
            self.saved_webhook = current
            await kube.delete(WEBHOOK_PATH)
        await self.wait_webhook(kube, active=False)

    async def register(self, kube: Kube) -> None:
        if await kube.get(WEBHOOK_PATH) is None:
            if self.saved_webhook is None:
                raise ClusterError("no saved webhook configuration to restore")
            meta = {k: v for k, v in self.saved_webhook["metadata"].items() if k in ("name", "labels", "annotations")}
            await kube.create(WEBHOOK_PATH.rsplit("/", 1)[0], {**self.saved_webhook, "metadata": meta})
        await self.wait_webhook(kube, active=True)

    async def wait_webhook(self, kube: Kube, active: bool, timeout: float = 30) -> None:
        """Until a dry-run TaskRun create is (or is not) mutated by the webhook."""
        namespace = self.probe_namespace
        deadline = time.monotonic() + timeout
        while True:
            body = bench_taskrun(namespace, f"probe-{int(time.monotonic() * 1000)}")
            answer = await kube.request("POST", f"/apis/tekton.dev/v1/namespaces/{namespace}/taskruns", body,
                                        params={"dryRun": "All"})
            if ("egress-placer.io/decision" in (answer["metadata"].get("annotations") or {})) == active:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the webhook did not become {'active' if active else 'inactive'} in {timeout:.0f} s")
            await _sleep(0.3)

    # -- lifecycle ---------------------------------------------------------------------------
    def down(self) -> None:
        if self.owned:
            self.cluster.down()
        else:
            self.stop_controller()


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def up(sizes: Sizes, workdir: Path, log: Log, cluster_dir: Path | None = None) -> BenchCluster:
    """Bring up a cluster with enough egress nodes for the pools (or use the running one in
    `cluster_dir`), and write the benchmarks' policy file."""
    pools = pool_nodes(sizes)
    needed = sum(len(v) for v in pools.values())
    if cluster_dir is not None:
        cluster = Cluster(cluster_dir, log=log)
        if not cluster.is_running():
            raise ClusterError(f"{cluster_dir} does not hold a running cluster")
        if int(cluster.state().get("egress_nodes", 0)) < needed:
            raise ClusterError(f"{cluster_dir} has fewer than the {needed} egress nodes the pools need")
        owned = False
    else:
        cluster = Cluster(workdir / "cluster", nodes=sizes.ordinary_nodes, egress_nodes=needed, log=log)
        cluster.up(owner_pid=os.getpid())
        owned = True
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(policy_text(pools))
    return BenchCluster(cluster, sizes, workdir, pools, policy_file, owned, log)


def versions(cluster: Cluster) -> dict[str, str | None]:
    """Kubernetes, etcd, KWOK and Tekton versions, read from the build cache's directory name."""
    name = Path(cluster.state().get("bin_dir", "")).parent.name  # k8s-v1.37.2_etcd-v3.6.16_kwok-v0.8.0_tekton-v1.15.0_...
    found = dict(part.split("-", 1) for part in name.split("_") if "-" in part)
    return {k: found.get(k) for k in ("k8s", "etcd", "kwok", "tekton")}


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
