"""What the reliability tests read from the local cluster while they break it: pool taints, the leader
Lease, the controller replicas' and the API server's metrics, intruder pods and whether they are gone,
and `quietly`, which lets a `wait_for` probe outlast an API server that is away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.core.model import TAINT_KEY
from devcluster.cluster import Cluster
from devplacer.controller import NAMESPACE, ControllerReplica, replicas_of
from tests.e2e.tekton_runs import ORDINARY_NODES, POOL, POOL_NODES, POOL_TOLERATION

T = TypeVar("T")

LEASE = "egress-placer-leader"
POOL_TAINT = {"key": TAINT_KEY, "value": POOL, "effect": "NoSchedule"}
POOL_LABEL = {TAINT_KEY: POOL}  # the devcluster's pool nodes carry it; the policy selects on it


def quietly(probe: Callable[[], T]) -> Callable[[], T | bool]:
    """`probe` for `wait_for` while the API server may be restarting: False while it cannot be reached
    (connection errors, 5xx, 404, 429), the probe's answer otherwise; other 4xx errors still fail."""

    def answer() -> T | bool:
        try:
            return probe()
        except (ApiException, requests.RequestException, OSError) as error:
            if isinstance(error, ApiException) and 400 <= (error.status or 0) < 500 and error.status not in (404, 429):
                raise
            return False

    return answer


# -- nodes and taints ------------------------------------------------------------------------------


def pool_taints(core: client.CoreV1Api, node: str) -> list[dict[str, Any]]:
    """The taints with egress-placer's key on `node`."""
    taints = core.read_node(node).spec.taints or []
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints if t.key == TAINT_KEY]


def taints_right(core: client.CoreV1Api) -> bool:
    """Every pool node carries exactly the pool taint, no ordinary node carries one."""
    by_node = {n.metadata.name: n.spec.taints or [] for n in core.list_node().items}
    owned = {
        name: [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints if t.key == TAINT_KEY]
        for name, taints in by_node.items()
    }
    return all(owned.get(n) == [POOL_TAINT] for n in POOL_NODES) and all(not owned.get(n) for n in ORDINARY_NODES)


def remove_pool_taint(kube: client.ApiClient, node: str) -> None:
    """Delete egress-placer's taint from `node` by hand (admin), as an operator might by mistake."""
    core = client.CoreV1Api(kube)
    current = core.read_node(node)
    kept = [kube.sanitize_for_serialization(t) for t in current.spec.taints or [] if t.key != TAINT_KEY]
    core.patch_node(
        node,
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": current.metadata.resource_version},
            {"op": "replace", "path": "/spec/taints", "value": kept},
        ],
    )


# -- pods ------------------------------------------------------------------------------------------


def intruder_pod(name: str, node: str | None = "egress-1", **spec: Any) -> dict[str, Any]:
    """A plain pod, by default put straight onto pool node `node` (nodeName) with the pool toleration."""
    body_spec: dict[str, Any] = {
        "tolerations": [POOL_TOLERATION],
        "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}],
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        body_spec["nodeName"] = node
    body_spec.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body_spec}


def pod_gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Deleted, or being deleted (an eviction sets deletionTimestamp)."""
    try:
        return core.read_namespaced_pod(name, namespace).metadata.deletion_timestamp is not None
    except ApiException as e:
        if e.status == 404:
            return True
        raise


def pod_node(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    return core.read_namespaced_pod(name, namespace).spec.node_name


# -- the controller --------------------------------------------------------------------------------


def lease_holder(kube: client.ApiClient) -> str | None:
    try:
        lease = client.CoordinationV1Api(kube).read_namespaced_lease(LEASE, NAMESPACE)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return lease.spec.holder_identity or None


def delete_lease(kube: client.ApiClient) -> None:
    try:
        client.CoordinationV1Api(kube).delete_namespaced_lease(LEASE, NAMESPACE)
    except ApiException as e:
        if e.status != 404:
            raise


def parse_samples(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of every sample of metric `name` whose labels include `labels` (Prometheus text)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        present = dict(
            part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part
        )
        if all(present.get(k) == f'"{v}"' for k, v in (labels or {}).items()):
            total += float(value)
    return total


@dataclass(frozen=True)
class Placer:
    """The egress-placer replicas running on the cluster (looked up again after each restart)."""

    cluster: Cluster

    @property
    def replicas(self) -> list[ControllerReplica]:
        return replicas_of(self.cluster)

    def replica(self, identity: str) -> ControllerReplica:
        return next(r for r in self.replicas if r.identity == identity)

    def metric(self, replica: ControllerReplica, name: str, labels: Mapping[str, str] | None = None) -> float:
        text = requests.get(replica.health_url + "/metrics", timeout=5).text
        return parse_samples(text, name, labels)

    def ready(self, replica: ControllerReplica) -> bool:
        try:
            return requests.get(replica.health_url + "/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def pid(self, replica: ControllerReplica) -> int:
        record = self.cluster.process(replica.name)
        assert record is not None and record.alive(), f"{replica.name} is not running"
        return record.pid


def apiserver_metrics(cluster: Cluster) -> str:
    """The API server's /metrics (admin client certificate)."""
    return cluster.api().session.get(cluster.api_url + "/metrics", timeout=10).text
