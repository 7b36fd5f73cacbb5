"""Kyverno, the peer a user would install instead of egress-placer, run beside it on the bench cluster.

Kyverno v1.19.1's admission controller is built from its Go module (`devcluster build --with kyverno`,
on demand) and runs out of cluster as one of the cluster's recorded processes: `--serverIP
127.0.0.1:PORT` makes it register its webhooks by URL (`https://127.0.0.1:PORT/...`) with a CA it makes
itself and keeps in Secrets of namespace `kyverno`; `--webhookServerHost 127.0.0.1` and `--metricsHost
127.0.0.1` keep it on loopback. Its CRDs come from the module. It runs with the cluster admin's
kubeconfig (its own ServiceAccount and RBAC are the Helm chart's, not rebuilt here).

The policy is what a user would write instead of egress-placer (`cluster_policy`): for Pods created in
the pool's allowed namespaces whose containers' images match the pool's globs, add the pool's node
constraint (the same required node-affinity terms egress-placer writes: `pool_terms`) and the pool's
toleration, with a JSON patch as Kyverno's own "add tolerations" sample does; `failurePolicy: Ignore`
and a 3 s timeout, as egress-placer's hooks.

Switching it on and off between benchmark blocks: Kyverno keeps its webhook configurations as it wants
them (a deleted one comes back), so its ConfigMap's `webhooks.namespaceSelector` restricts every Kyverno
webhook to namespaces labelled `bench.egress-placer.io/kyverno=on`, and the bench sets or removes that
label (`switch`). It keeps running (informers, leader election, certificates) in every mode, as an
installed policy engine does: its CPU shows in every mode's per-process table.

What Kyverno does not do of egress-placer's job (and this benchmark does not build for it): see `CANNOT`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from controller.core.patches import pool_terms
from controller.core.pools import load_any_policy
from devcluster import build, kyverno as devcluster_kyverno
from devcluster.cluster import Cluster, ClusterError
from devcluster.process import free_port, rss_bytes
from devplacer.local_placer import kubectl

from bench import machine
from bench.floor import bench_pod, listening
from bench.kube import Kube, ensure_namespace

PROCESS = devcluster_kyverno.NAME
NAMESPACE = devcluster_kyverno.NAMESPACE
SWITCH_LABEL = "bench.egress-placer.io/kyverno"
SKIP_LABEL = "egress-placer.io/webhook"  # =skip: egress-placer's webhooks (k8s/webhook.yaml) leave the namespace out
POLICY_PATH = devcluster_kyverno.POLICY_PATH
Log = Callable[[str], None]

# What egress-placer does that a Kyverno mutate policy does not (docs/ and the README say how egress-placer does it).
CANNOT = (
    "TaskRun-level decisions: the policy sees one Pod at a time; it cannot read the TaskRun, its Task or "
    "Pipeline (taskRef/pipelineRef, resolvers, StepActions) to learn a run's images before its pod exists, nor "
    "place a PipelineRun's pods together or write a run's podTemplate",
    "load: it picks no node; every pod gets the whole pool and the scheduler spreads them by its own scores "
    "(no least-loaded node, no assumed placements within a burst, no egress bandwidth from Prometheus)",
    "taints: it does not taint the pool's nodes or keep the taints current as nodes join and leave the pool "
    "(without a taint, nothing keeps other pods off the pool)",
    "intruders: it does not find or evict pods already running on pool nodes that may not be there, nor "
    "strip pool tolerations from pods of namespaces the pool does not allow",
    "pool objects: its policy is written per pool by hand (node names, globs, namespaces); no EgressPool "
    "API, status, Events per decision or metrics of placements",
)


def bench_pool(policy_text: str, name: str) -> Any:
    """Pool `name` of the benchmarks' policy, as egress-placer's loader reads it."""
    policy = load_any_policy(policy_text, "<bench policy>")
    pool = policy.pool(name)
    if pool is None:
        raise ClusterError(f"no pool {name} in the bench policy")
    return pool


def cluster_policy(pool: Any) -> dict[str, Any]:
    """The ClusterPolicy a user would write for `pool`: its namespaces and image globs, its node
    constraint (egress-placer's own `pool_terms`) and its toleration."""
    patch = [
        {"op": "add", "path": "/spec/tolerations/-", "value": dict(pool.toleration())},
        {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": pool_terms(pool)}}}},
    ]
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": f"egress-{pool.name}"},
        "spec": {
            "admission": True,
            "background": False,
            "failurePolicy": "Ignore",
            "webhookTimeoutSeconds": 3,
            "rules": [{
                "name": "place-on-pool",
                "match": {"any": [{"resources": {"kinds": ["Pod"], "operations": ["CREATE"],
                                                 "namespaces": list(pool.namespaces)}}]},
                "preconditions": {"any": [{"key": "{{ request.object.spec.containers[].image }}",
                                           "operator": "AnyIn", "value": list(pool.images)}]},
                "mutate": {"patchesJson6902": yaml.safe_dump(patch, sort_keys=False)},
            }],
        },
    }


def config_map() -> dict[str, Any]:
    """Kyverno's ConfigMap: every webhook only for namespaces the bench switched on."""
    return devcluster_kyverno.config_map({"matchLabels": {SWITCH_LABEL: "on"}})


@dataclass
class Kyverno:
    cluster: Cluster
    pid: int
    port: int
    version: str
    start_s: float  # process start to its policy in force (a probe pod mutated)
    probe_namespace: str  # allowed by the pool, skipped by egress-placer's (and the floor's) webhooks

    def cpu_seconds(self) -> float | None:
        return machine.cpu_seconds(self.pid)

    def rss_mb(self) -> float | None:
        rss = rss_bytes(self.pid)
        return round(rss / 2**20, 1) if rss else None

    async def switch(self, kube: Kube, namespaces: list[str], on: bool) -> None:
        """Label (or unlabel) `namespaces` and the probe namespace; wait until a dry-run pod there is (not) mutated."""
        for ns in [*namespaces, self.probe_namespace]:
            await label(kube, ns, on)
        await wait_mutating(kube, self.probe_namespace, on)

    def stop(self) -> None:
        self.cluster.stop_process(PROCESS)


async def label(kube: Kube, namespace: str, on: bool) -> None:
    await kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {SWITCH_LABEL: "on" if on else None}}})


async def mutated(kube: Kube, namespace: str) -> bool:
    """Whether a dry-run Tekton pod create in `namespace` comes back with the pool toleration from Kyverno."""
    pod = bench_pod(namespace, f"kyverno-probe-{int(time.monotonic() * 1000)}")
    answer = await kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, params={"dryRun": "All"})
    return "affinity" in (answer.get("spec") or {}) and "affinity" not in pod["spec"]


async def wait_mutating(kube: Kube, namespace: str, active: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while await mutated(kube, namespace) != active:
        if time.monotonic() > deadline:
            raise ClusterError(f"Kyverno's policy did not become {'active' if active else 'inactive'} in {timeout:.0f} s")
        await asyncio.sleep(0.5)


def _install_crds(cluster: Cluster, bin_dir: Path) -> None:
    for name in build.KYVERNO.module_files:
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(build.optional_file(bin_dir, name)))
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in devcluster_kyverno.ESTABLISHED))


async def start(cluster: Cluster, kube: Kube, pool: Any, probe_namespace: str, log: Log) -> Kyverno:
    """Build (on demand), install the CRDs, namespace, ConfigMap and ClusterPolicy, start Kyverno, and
    return once a labelled probe namespace's dry-run pod comes back mutated (then the label is removed).

    `probe_namespace` must be one the pool allows; it is labelled `egress-placer.io/webhook=skip`, so that
    only Kyverno can have mutated its probe pods, whatever else is registered."""
    await ensure_namespace(kube, probe_namespace, {SKIP_LABEL: "skip"})
    bin_dir = build.ensure_optional(PROCESS, log)
    version = build.pinned_version(build.KYVERNO)
    _install_crds(cluster, bin_dir)
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=json.dumps(devcluster_kyverno.namespace_manifest()))
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(config_map()))
    port, metrics_port = free_port(), free_port()
    argv = devcluster_kyverno.command_argv(bin_dir, cluster.kubeconfig, port, metrics_port)
    env = devcluster_kyverno.command_env("kyverno-bench-0")
    cluster.stop_process(PROCESS)  # one left by an interrupted run on a kept cluster (--cluster-dir)
    started = time.monotonic()
    record = cluster.start_process(PROCESS, argv, env, port=port)
    try:
        await listening(port, "Kyverno", record.log, record.pid, timeout=180)
        await kube.create(POLICY_PATH, cluster_policy(pool), exist_ok=True)
        await label(kube, probe_namespace, True)
        await wait_mutating(kube, probe_namespace, True, timeout=180)
        start_s = round(time.monotonic() - started, 1)
        await label(kube, probe_namespace, False)
        await wait_mutating(kube, probe_namespace, False)
    except BaseException:
        log(f"kyverno: failed to start; log {record.log}")
        cluster.stop_process(PROCESS)
        raise
    return Kyverno(cluster, record.pid, port, version, start_s, probe_namespace)
