"""What the reliability tests read from and put on the local cluster while they break it, beyond the
shared harness (tests/e2e/harness.py: the controller, pool taints, the leader Lease, `quietly`):
intruder pods and whether they are gone, and the API server's metrics."""

from __future__ import annotations

from typing import Any

from tests.e2e.tekton_runs import POOL_TOLERATION, Runs, node_of
from tests.kube import Api, pods


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


def apiserver_metrics(api: Api) -> str:
    """The API server's /metrics."""
    return api.text("/metrics")
