"""What the reliability tests read from the local cluster while they break it: pool taints, the leader
Lease, the controller replicas' and the API server's metrics, intruder pods and whether they are gone,
and `quietly`, which lets a `wait_for` probe outlast an API server that is away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import requests
import urllib3
from kubernetes.client.exceptions import ApiException

from controller.core.model import TAINT_KEY
from devcluster.cluster import Cluster
from devplacer.local_placer import NAMESPACE, ControllerReplica, replicas_of
from tests.e2e.tekton_runs import ORDINARY_NODES, POOL_NODES, POOL_TAINT, POOL_TOLERATION, Runs, node_of
from tests.kube import Api, namespaced, node, pods

T = TypeVar("T")

LEASE = "egress-placer-leader"
LEASE_PATH = namespaced(NAMESPACE, "leases", LEASE, group="/apis/coordination.k8s.io/v1")


def quietly(probe: Callable[[], T]) -> Callable[[], T | bool]:
    """`probe` for `wait_for` while the API server may be restarting: False while it cannot be reached
    (connection errors, 5xx, 404, 429), the probe's answer otherwise; other 4xx errors still fail."""

    def answer() -> T | bool:
        try:
            return probe()
        except (ApiException, requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            if isinstance(error, ApiException) and 400 <= (error.status or 0) < 500 and error.status not in (404, 429):
                raise
            return False

    return answer


# -- nodes and taints ------------------------------------------------------------------------------


def taints_right(api: Api) -> bool:
    """Every pool node carries exactly the pool taint, no ordinary node carries one."""
    owned = {
        n["metadata"]["name"]: [
            {"key": t["key"], "value": t.get("value"), "effect": t["effect"]}
            for t in n["spec"].get("taints") or []
            if t["key"] == TAINT_KEY
        ]
        for n in api.items(node())
    }
    return all(owned.get(n) == [POOL_TAINT] for n in POOL_NODES) and all(not owned.get(n) for n in ORDINARY_NODES)


def remove_pool_taint(api: Api, name: str) -> None:
    """Delete egress-placer's taint from node `name` by hand (admin), as an operator might by mistake."""
    current = api.call("GET", node(name))
    kept = [t for t in current["spec"].get("taints") or [] if t["key"] != TAINT_KEY]
    api.json_patch(node(name), [
        {"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ])


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


def sneak_onto(api: Api, runs: Runs, namespace: str, name: str, node: str) -> None:
    """Put intruder `name` on pool node `node` the way admission cannot stop (it strips a pool node's
    nodeName and the pool toleration at CREATE): pinned to the node by its hostname label, held back by
    the taint, then given the pool toleration by an UPDATE. `runs` creates the pod (and cleans it up)."""
    runs.create_pod(namespace, intruder_pod(name, node=None, tolerations=[], nodeSelector={"kubernetes.io/hostname": node}))
    api.json_patch(pods(namespace, name), [{"op": "add", "path": "/spec/tolerations/-", "value": POOL_TOLERATION}])


def pod_gone(api: Api, namespace: str, name: str) -> bool:
    """Deleted, or being deleted (an eviction sets deletionTimestamp)."""
    pod = api.get(pods(namespace, name))
    return pod is None or "deletionTimestamp" in pod["metadata"]


def pod_node(api: Api, namespace: str, name: str) -> str | None:
    return node_of(api.call("GET", pods(namespace, name)))


# -- the controller --------------------------------------------------------------------------------


def lease_holder(api: Api) -> str | None:
    lease = api.get(LEASE_PATH)
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


def delete_lease(api: Api) -> None:
    api.delete(LEASE_PATH)


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


def apiserver_metrics(api: Api) -> str:
    """The API server's /metrics."""
    return api.text("/metrics")
