"""Fixtures of the end-to-end tests: the e2e policy in force, the tenant namespaces team-cdn (may use
pool `overseas`) and team-other (may not), egress-placer running as in a cluster, and a per-test
`Runs` that deletes what the test made. At module teardown the cluster is made plain again: the
controller stopped, its webhook configuration deleted, its taints removed, the namespaces gone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tekton_runs import TEAM_CDN, TEAM_OTHER, Runs, Waiter

from controller.core.model import TAINT_KEY
from devcluster.cluster import Cluster
from devcluster.controller import (
    WEBHOOK_CONFIG,
    ControllerReplica,
    replicas_of,
    start_controller,
    stop_controller,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "e2e"
POLICY_FILE = DATA / "policy.yaml"
INVALID_POLICY_FILE = DATA / "policy-invalid.yaml"


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
        wanted = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
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


@pytest.fixture(scope="module")
def tenants(kube: client.ApiClient, make_namespace: Callable[[str], str], wait_for: Waiter) -> Iterator[tuple[str, str]]:
    """team-cdn and team-other, each with its `default` ServiceAccount; deleted (and gone) afterwards."""
    core = client.CoreV1Api(kube)
    for name in (TEAM_CDN, TEAM_OTHER):
        wait_for(f"namespace {name} from an earlier module to be gone", lambda: not _exists(core, name), timeout=90)
        make_namespace(name)
    yield TEAM_CDN, TEAM_OTHER
    for name in (TEAM_CDN, TEAM_OTHER):
        core.delete_namespace(name)
    for name in (TEAM_CDN, TEAM_OTHER):
        wait_for(f"namespace {name} to be deleted", lambda: not _exists(core, name), timeout=90)


def _exists(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


@pytest.fixture(scope="module")
def egress_placer(devcluster: Cluster, kube: client.ApiClient, tenants: tuple[str, str]) -> Iterator[EgressPlacer]:
    """egress-placer started with the e2e policy under its `k8s/` identity; the cluster made plain after."""
    try:
        start_controller(devcluster, POLICY_FILE)
        yield EgressPlacer(devcluster)
    finally:
        stop_controller(devcluster)
        try:
            client.AdmissionregistrationV1Api(kube).delete_mutating_webhook_configuration(WEBHOOK_CONFIG)
        except ApiException as e:
            if e.status != 404:
                raise
        remove_pool_taints(kube)


@pytest.fixture
def runs(kube: client.ApiClient, wait_for: Waiter, egress_placer: EgressPlacer) -> Iterator[Runs]:
    """Creates this test's runs and pods (labelled with the test's id) and deletes them afterwards."""
    made = Runs(kube, wait_for)
    yield made
    made.cleanup()
