"""The egress-placer process the end-to-end tests run (through devplacer.controller): where its
replica listens, its JSON log, its metrics; and how to remove its taints once it is stopped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.core.guard import GUARD_NAME
from controller.core.model import TAINT_KEY
from devcluster.cluster import Cluster
from devplacer.controller import NAMESPACE, WEBHOOK_CONFIG, ControllerReplica, replicas_of, stop_controller

DATA = Path(__file__).resolve().parents[1] / "data" / "e2e"
POLICY_FILE = DATA / "policy.yaml"
INVALID_POLICY_FILE = DATA / "policy-invalid.yaml"  # `placment` (line 10) is not a field

@dataclass(frozen=True)
class EgressPlacer:
    """The running controller of this module (its replica is looked up again after a restart)."""

    cluster: Cluster

    @property
    def replica(self) -> ControllerReplica:
        return replicas_of(self.cluster)[0]

    @property
    def log(self) -> Path:
        return self.cluster.dir / "logs" / f"{self.replica.name}.log"

    def log_records(self, offset: int = 0) -> list[dict[str, object]]:
        """The JSON log lines written from byte `offset` on (other lines are skipped)."""
        with open(self.log, "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def metric(self, name: str, labels: dict[str, str]) -> float:
        """One sample from /metrics (0 when the series does not exist yet)."""
        text = requests.get(self.replica.health_url + "/metrics", timeout=5).text
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == wanted:
                return float(value)
        return 0.0


def remove_pool_taints(kube: client.ApiClient) -> None:
    """Delete every taint with egress-placer's key from every node."""
    core = client.CoreV1Api(kube)
    for node in core.list_node().items:
        taints = node.spec.taints or []
        kept = [t for t in taints if t.key != TAINT_KEY]
        if len(kept) != len(taints):
            patch = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": node.metadata.resource_version},
                {"op": "replace", "path": "/spec/taints", "value": [kube.sanitize_for_serialization(t) for t in kept]},
            ]
            core.patch_node(node.metadata.name, patch)


def namespace_exists(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def remove_pool_guard(kube: client.ApiClient) -> None:
    """Delete the pool guard's binding, policy and params (each may be missing)."""
    admission = client.AdmissionregistrationV1Api(kube)
    for delete in (
        lambda: admission.delete_validating_admission_policy_binding(GUARD_NAME),
        lambda: admission.delete_validating_admission_policy(GUARD_NAME),
        lambda: client.CoreV1Api(kube).delete_namespaced_config_map(GUARD_NAME, NAMESPACE),
    ):
        try:
            delete()
        except ApiException as e:
            if e.status != 404:
                raise


def make_plain(kube: client.ApiClient, cluster: Cluster) -> None:
    """No controller, no webhook configuration, no pool guard, no pool taints: what later test modules expect."""
    stop_controller(cluster)
    try:
        client.AdmissionregistrationV1Api(kube).delete_mutating_webhook_configuration(WEBHOOK_CONFIG)
    except ApiException as e:
        if e.status != 404:
            raise
    remove_pool_guard(kube)
    remove_pool_taints(kube)
